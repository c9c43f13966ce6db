"""Paper 003's Fig. 2 (App. A.4: FedDyn against FedSplit on CIFAR-10 IID, 100
devices, full and 10 % participation) as the experiments of
experiments/configs/paper003_figures.py: each setting pinned to its source."""

import pytest

from experiments import reproduce
from experiments.configs import base

FIG2 = {  # experiment -> (participation, cohort, FedDyn alpha, the tables' experiment)
    'feddyn_cifar10_p100_iid_fig2a': (None, 100, 0.01, 'feddyn_cifar10_p100_iid'),
    'feddyn_cifar10_p10_iid_fig2b': (0.1, 10, 0.1, 'feddyn_cifar10_p10_iid'),
}


def _experiment(name):
  from experiments import configs
  return configs.get(name)


def _plans(name, scale='full'):
  return {p.label: p.flags for p in reproduce.trainer_plans(_experiment(name), scale)}


def test_fig2_is_two_listed_experiments_one_per_panel():
  from experiments import configs
  experiments = configs.all_experiments()
  for name, panel in zip(FIG2, 'ab'):
    exp = experiments[name]
    assert exp.ref == f'Fig. 2 ({panel}), App. A.4'
    assert exp.description.startswith(f'Fig. 2 ({panel}): CIFAR-10, 100 devices')
    assert isinstance(exp.runner, base.TrainerRuns) and exp.runner.seeds == (0,)
    # A curve: no printed number to compare, none invented.
    assert exp.published == () and 'prints no number' in exp.notes


@pytest.mark.parametrize('name', FIG2)
def test_fig2_runs_the_papers_cifar10_setting(name):
  participation, cohort, _, _ = FIG2[name]
  for flags in _plans(name).values():
    assert (flags['task'], flags['model'], flags['num_clients'], flags['partition']) == (
        'cifar10', 'cnn003_text', 100, 'iid')
    assert 'dirichlet_alpha' not in flags and 'unbalanced_sigma' not in flags
    assert flags['total_rounds'] == 1000 and flags['rounds_per_eval'] == 1   # the axis
    assert flags['clients_per_round'] == cohort
    assert flags.get('participation_prob') == participation   # App. B.1, the code
    # App. A.2's CIFAR-10 local work for every method.
    assert (flags['client_batch_size'], flags['client_learning_rate'], flags['client_lr_decay'],
            flags['client_epochs_per_round']) == (50, 0.1, 1.0, 5)
    assert flags['client_weight_decay'] == 1e-3 and flags['clip_norm'] == 10.0


@pytest.mark.parametrize('name', FIG2)
def test_fig2_feddyn_is_the_tables_run_of_the_setting(name):
  _, _, alpha, table = FIG2[name]
  ours, tables = _plans(name)['feddyn'], _plans(table)['feddyn']
  assert ours == tables                        # same command as Tables 1/2's FedDyn
  assert ours['feddyn_alpha'] == alpha         # 0.01: code's example; 0.1: App. A.3
  assert ours['report_device_average'] and ours['feddyn_adaptive_alpha']


def test_fig2_fedsplit_variants():
  # (a): Act and All coincide at full participation, one run; (b): both.
  assert sorted(_plans('feddyn_cifar10_p100_iid_fig2a')) == ['feddyn', 'fedsplit']
  b = _plans('feddyn_cifar10_p10_iid_fig2b')
  assert sorted(b) == ['feddyn', 'fedsplit_act', 'fedsplit_all']
  runs = {'fedsplit': _plans('feddyn_cifar10_p100_iid_fig2a')['fedsplit'], **b}
  average = {'fedsplit': 'active', 'fedsplit_act': 'active', 'fedsplit_all': 'all'}
  for label, want in average.items():
    flags = runs[label]
    assert flags['algorithm'] == 'fedsplit' and flags['fedsplit_server_average'] == want
    assert flags['fedsplit_step_size'] == 1.0          # a stated choice (no source)
    assert 'report_device_average' not in flags        # its server model is evaluated


@pytest.mark.parametrize('name', FIG2)
def test_fig2_smoke_runs_offline_and_every_run_validates(name):
  for scale in ('smoke', 'full'):
    for plan in reproduce.trainer_plans(_experiment(name), scale):
      reproduce.validate_plan(plan)
  for flags in _plans(name, 'smoke').values():
    assert flags['task'] == 'feddyn_digits' and flags['partition'] == 'iid'
    assert 'model' not in flags and 'num_clients' not in flags

