"""Paper 004 (FedGBO): the reproduction configs run the authors' settings, and
the trainer runs FedGBO / MFL / Mimelite / MimeXlite with the paper's K and
optimiser when their flags are left unset."""

import os
import re
import subprocess
import sys

import pytest

from experiments import reproduce
from experiments.configs import paper004
from paths import ROOT

TABLE4 = [e for e in paper004.EXPERIMENTS if e.name.startswith('fedgbo_table4_')]
GBO_FAMILY = ('fedgbo', 'mfl', 'mimelite', 'mimexlite')


def _commands(experiment):
  """What `reproduce --print_commands --scale=full` prints, one line per run."""
  return [p.command('out') for p in reproduce.trainer_plans(experiment, 'full')]


def _flag(command, name):
  found = re.findall(rf'--{name}=(\S+)', command)
  return found[0] if found else None


def test_table4_has_its_three_datasets():
  assert [e.name for e in TABLE4] == [
      'fedgbo_table4_cifar100', 'fedgbo_table4_femnist', 'fedgbo_table4_shakespeare']


@pytest.mark.parametrize('experiment', TABLE4, ids=lambda e: e.name)
def test_table4_commands_run_k10_everywhere_with_uniform_weighting(experiment):
  """Algorithm 1 and fl_algs.py: K = 10 steps for every method (FedProx too) and
  the plain mean 1/M of the client models for every method."""
  commands = _commands(experiment)
  algorithms = {_flag(c, 'algorithm') for c in commands}
  assert algorithms == {'fedavg', 'fedprox', 'fedmax', 'mfl', 'mimelite', 'fedgbo'}
  for command in commands:
    assert _flag(command, 'local_steps') == '10', command
    assert _flag(command, 'uniform_weighting') == 'true', command
  fedprox = [c for c in commands if _flag(c, 'algorithm') == 'fedprox']
  assert len(fedprox) == len(paper004.SEEDS)


@pytest.mark.parametrize('experiment', paper004.EXPERIMENTS, ids=lambda e: e.name)
def test_adaptive_methods_run_the_authors_optimisers(experiment):
  """FedGBO, MFL, Mimelite, MimeXlite: v_0 = 1, no bias correction, eps = 1e-3
  and the dampened SGDm at the csv's own learning rate (no 1 - beta mapping)."""
  dataset = 'shakespeare' if 'table5' in experiment.name else experiment.name.split('_')[-1]
  k = 50 if experiment.name.endswith('k50') else 10
  for run in experiment.runner.runs:
    if run.algorithm not in GBO_FAMILY:
      continue
    assert run.flags['gbo_reference_conventions'] is True, run.label
    algorithm = next(a for a, name in paper004.ALGORITHM.items()
                     if name == run.algorithm and a != 'AdaptiveFedOpt')
    optimiser = {'sgdm': 'SGDm', 'rmsprop': 'RMSProp', 'adam': 'Adam'}[
        run.flags['client_optimizer']]
    setting = paper004.SETTINGS[(dataset, algorithm, optimiser, k)]
    assert run.flags['client_learning_rate'] == setting['lr'], run.label
    if optimiser == 'SGDm':
      assert run.flags['client_momentum'] == setting['beta'], run.label


def test_mfl_cifar100_is_the_csv_setting():
  commands = _commands(TABLE4[0])
  mfl = next(c for c in commands if _flag(c, 'algorithm') == 'mfl')
  # experiment-settings.csv: CIFAR100 MFL SGDm lr 0.01, beta 0.99.
  assert (_flag(mfl, 'client_learning_rate'), _flag(mfl, 'client_momentum'),
          _flag(mfl, 'gbo_reference_conventions')) == ('0.01', '0.99', 'true')


@pytest.mark.slow
def test_print_commands_binary_shows_k10_and_uniform_weighting():
  proc = subprocess.run(
      [sys.executable, '-m', 'experiments.reproduce', '--experiment=fedgbo_table4_femnist',
       '--scale=full', '--print_commands'],
      capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
      timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = [l for l in proc.stdout.splitlines() if l.startswith('python -m experiments.train')]
  assert len(lines) == 7 * len(paper004.SEEDS)
  assert all('--local_steps=10' in l and '--uniform_weighting=true' in l for l in lines)


# --- the trainer's defaults for flags left unset ------------------------------

def _resolved(*argv):
  from absl import flags
  from experiments.lib import flags as trainer_flags
  import experiments.train  # noqa: F401  (defines the binary's own flags)
  FLAGS = flags.FLAGS
  FLAGS.unparse_flags()
  try:
    FLAGS(['train', *argv])
    _, hp, _ = trainer_flags.validate()
    return hp, trainer_flags.experiment_name(), trainer_flags.algorithm_defaults()
  finally:
    FLAGS.unparse_flags()


@pytest.mark.parametrize('algorithm', GBO_FAMILY)
def test_a_momentum_for_the_default_sgdm_is_taken(algorithm):
  """--client_momentum with --client_optimizer left unset: the algorithm's
  SGDm default takes it (the optimiser check runs after the defaults; on the
  raw flags it read plain sgd and refused the momentum)."""
  hp, _, _ = _resolved(f'--algorithm={algorithm}', '--client_momentum=0.5')
  assert (hp.client_optimizer, hp.client_momentum) == ('sgdm', 0.5)


def test_a_shared_momentum_is_dropped_where_the_optimiser_lacks_it():
  """fedgbo's binary passes one set of flags to its SGDm algorithms and its
  SGD baselines (`hparams(grid=True)`): an SGD run drops the momentum, as it
  drops other algorithms' flags; the trainer refuses it for plain SGD."""
  from absl import flags
  from experiments.lib import flags as trainer_flags
  import experiments.train  # noqa: F401
  FLAGS = flags.FLAGS
  FLAGS.unparse_flags()
  try:
    FLAGS(['train', '--client_momentum=0.95', '--algorithm=fedavg'])
    base = trainer_flags.TrainerArgs.from_flags()
    sgd = trainer_flags.hparams(grid=True, args=base)
    assert (sgd.client_optimizer, sgd.client_momentum) == ('sgd', None)
    gbo = trainer_flags.hparams(grid=True, args=base.override(algorithm='fedgbo'))
    assert (gbo.client_optimizer, gbo.client_momentum) == ('sgdm', 0.95)
    with pytest.raises(trainer_flags.FlagError, match='--client_momentum is not used by '
                       '--client_optimizer=sgd'):
      trainer_flags.validate(args=base)
  finally:
    FLAGS.unparse_flags()


@pytest.mark.parametrize('algorithm', GBO_FAMILY)
def test_unset_flags_take_the_papers_k_and_sgdm(algorithm):
  hp, name, defaults = _resolved(f'--algorithm={algorithm}')
  assert (hp.client_optimizer, hp.local_steps) == ('sgdm', 10)
  assert defaults == dict(client_optimizer='sgdm', local_steps=10)
  assert '_csgdm' in name and '_K10_' in name


def test_flags_given_beat_the_papers_defaults():
  hp, _, defaults = _resolved('--algorithm=fedgbo', '--client_optimizer=adam',
                              '--local_steps=50')
  assert (hp.client_optimizer, hp.local_steps, defaults) == ('adam', 50, {})
  hp, _, _ = _resolved('--algorithm=mimelite', '--client_epochs_per_round=2')
  assert (hp.client_optimizer, hp.local_steps, hp.client_epochs_per_round) == (
      'sgdm', None, 2)
  hp, _, defaults = _resolved('--algorithm=fedavg')
  assert (hp.client_optimizer, hp.local_steps, defaults) == ('sgd', None, {})


def test_resolved_defaults_build_the_papers_optimiser():
  from tff_algos.algorithms.gbo import optimizers as gbo_optimizers
  from tff_algos.flags import algorithm_flags
  hp, _, _ = _resolved('--algorithm=fedgbo')
  config = algorithm_flags.config('fedgbo', hp)
  assert (gbo_optimizers.of_config(config), config.local_steps) == (gbo_optimizers.SGDm(0.9), 10)
  hp, _, _ = _resolved('--algorithm=mfl')
  assert gbo_optimizers.of_config(algorithm_flags.config('mfl', hp)) == gbo_optimizers.SGDm(0.9)


@pytest.mark.slow
@pytest.mark.parametrize('algorithm', GBO_FAMILY)
def test_trainer_runs_with_defaults(algorithm, tmp_path):
  proc = subprocess.run(
      [sys.executable, '-m', 'experiments.train', f'--algorithm={algorithm}',
       '--total_rounds=2', f'--root_output_dir={tmp_path}', '--noprogress'],
      capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
      timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'final eval' in proc.stdout
  (run,) = os.listdir(tmp_path)
  assert f'_{algorithm}_csgdm0.1_' in run and '_K10_' in run


@pytest.mark.parametrize('experiment', TABLE4, ids=lambda e: e.name)
def test_fedmax_uses_the_reference_codes_kl_direction(experiment):
  """The paper does not say; the reference code's term is KL(uniform || softmax(a))."""
  fedmax = next(c for c in _commands(experiment) if _flag(c, 'algorithm') == 'fedmax')
  assert _flag(fedmax, 'fedmax_reference_kl') == 'true'
  assert _flag(fedmax, 'fedmax_beta') == '1.0'
