"""Paper 003: Acar et al., "Federated Learning Based on Dynamic Regularization"
(FedDyn, ICLR 2021): Tables 1, 2, 4, 5 (models transmitted to reach a target
test accuracy) and Table 6 (synthetic; target training loss).

Every setting (dataset, number of devices, participation, split, balance)
compares FedDyn, SCAFFOLD, FedAvg and FedProx; each published entry is the
number of models sent server -> device (per client slot; SCAFFOLD counts 2 per
round) until the test accuracy first reaches the target: key
'<algorithm>/models_to<target>'. Entries printed as "N+" (target not reached
within the budget) are not comparable numbers and are listed in the notes.

`ALL_SETTINGS` is the transcription of the five tables, one row per setting
with the published values of every method; `EXPERIMENTS` has one experiment
per setting of Tables 1, 2, 4 and 5 (50 settings, 200 trainer runs). Settings
printed in several tables (Table 1's 100-device rows = Table 4's balanced
rows = Table 2's omitted 10 % CIFAR rows) are one experiment. Table 6's
settings (training-loss targets, the synthetic problem) are transcribed here
but run by their own experiment.

Every run evaluates the average of ALL device models, as the paper reports
("we report the performance of the average model from all devices", App.
A.2) and its code computes for all four methods (`--report_device_average`:
plain mean for FedDyn and SCAFFOLD, n_k-weighted for FedAvg and FedProx as
the code weights them).

Hyperparameters (App. A.2; batch 50, or 100 for Shakespeare; weight decay;
learning-rate decay per round; gradient clipping "for all methods", norm 10 in
the reference code): FedDyn runs use the reference code's conventions
(alpha_k = alpha / (n_k / mean n), the alpha term as weight decay, clipping
10). Where App. A.2 leaves a value open (CIFAR-10/100 with 100 devices: alpha,
mu and the lr decay were "selected from" grids), the reference code's CIFAR-10
example (alpemreacar/FedDyn example_cifar_10.py: alpha 1e-2, mu 1e-4, no lr
decay, 5 epochs, weight decay 1e-3) is used, except alpha = 0.1 for CIFAR-10
IID 10 % (App. A.3: best alpha there); each experiment's notes say which.

All four methods clip the local gradient to norm 10 and add the weight decay
(reference code); FedAvg and FedProx run FedAvg's epochs with the lr decay.
SCAFFOLD's global step is 1 (not stated; the reference code's default), and
it runs the reference code's control variates (`--scaffold_reference_conventions`:
c scaled by client size on unbalanced data, c_i+ over the initial lr).

Shakespeare (`shakespeare_003`): the paper's samples (an 80-character window
and the next character; 100 devices x 2,000 samples, 400 test samples each)
and its model (Embedding 8, 2 x LSTM 100), from TFF's Shakespeare roles:
`--partition=natural` (one device per role) or `iid` (all roles' samples
dealt out at random), as LEAF's two splits.

Fig. 2 (FedDyn against FedSplit, App. A.4) is in `paper003_figures`. Not
here: Fig. 1 (alpha sensitivity), Figs. 4-13 (convergence curves of the
tables' runs).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Union

from experiments.configs.base import Experiment, Published, Run, TrainerRuns

PAPER = '003 Acar et al. 2021 (FedDyn)'
ALGORITHMS = ('feddyn', 'scaffold', 'fedavg', 'fedprox')
Entry = Union[int, str]   # models transmitted, or 'N+' (not reached within the budget)


@dataclasses.dataclass(frozen=True)
class Setting:
  tables: str                 # where its numbers are printed
  dataset: str                # cifar10, cifar100, mnist, emnistl, shakespeare, synthetic
  participation: float        # fraction of devices per round
  split: str                  # iid, dir0.6, dir0.3, noniid (Shakespeare roles), type1...
  rows: tuple                 # ((target accuracy %, (feddyn, scaffold, fedavg, fedprox)), ...)
  devices: int = 100
  balanced: bool = True

  @property
  def name(self) -> str:
    part = f'p{self.participation * 100:g}'
    dev = '' if self.devices == 100 or self.dataset == 'synthetic' else f'_{self.devices}dev'
    bal = '' if self.balanced else '_unbalanced'
    return f'feddyn_{self.dataset}_{part}_{self.split}{dev}{bal}'.replace('.', '')


def _setting(tables, dataset, participation, split, rows, devices=100, balanced=True):
  return Setting(tables, dataset, participation, split, tuple(rows), devices, balanced)


T1 = 'Table 1 (100 devices), Table 4 (balanced)'
ALL_SETTINGS = (
    # ---- 100 devices, 10 %, balanced: Table 1 (moderate), Table 4 (balanced),
    # Table 2 (10 %: "omitted since reported in Table 1").
    _setting(T1, 'cifar10', 0.1, 'iid', [(84.5, (637, 1852, '1000+', '1000+')),
                                         (82.3, (240, 512, 994, 825))]),
    _setting(T1, 'cifar100', 0.1, 'iid', [(51.0, (522, 1854, '1000+', '1000+')),
                                          (40.9, (159, 286, 822, 873))]),
    _setting(T1, 'cifar10', 0.1, 'dir0.3', [(82.5, (444, 1880, '1000+', '1000+')),
                                            (80.7, (232, 594, 863, 930))]),
    _setting(T1, 'cifar100', 0.1, 'dir0.3', [(51.0, (561, 1884, '1000+', '1000+')),
                                             (42.3, (170, 330, 959, 882))]),
    # ---- Table 1, massive: 1000 devices (CIFAR-10), 500 devices (CIFAR-100), 10 %.
    _setting('Table 1 (1000 devices)', 'cifar10', 0.1, 'iid',
             [(80.0, (840, '4000+', '2000+', '2000+')), (62.3, (305, 928, 1277, 1274))],
             devices=1000),
    _setting('Table 1 (500 devices)', 'cifar100', 0.1, 'iid',
             [(50.1, (1445, 3982, '2000+', '2000+')), (38.3, (477, 1408, 1997, 1974))],
             devices=500),
    _setting('Table 1 (1000 devices)', 'cifar10', 0.1, 'dir0.3',
             [(80.0, (831, '4000+', '2000+', '2000+')), (70.6, (350, 2138, 1962, 1517))],
             devices=1000),
    _setting('Table 1 (500 devices)', 'cifar100', 0.1, 'dir0.3',
             [(47.0, (969, 4000, '2000+', '2000+')), (39.9, (467, 2266, 1913, 1794))], devices=500),
    # ---- Table 2, 100 % participation.
    _setting('Table 2 (100%)', 'cifar10', 1.0, 'iid', [(85.0, (198, 1860, '1000+', '1000+')),
                                                       (81.4, (67, 320, 754, 655))]),
    _setting('Table 2 (100%)', 'cifar100', 1.0, 'iid', [(51.0, (259, 1744, '1000+', '1000+')),
                                                        (39.4, (55, 172, '1000+', 741))]),
    _setting('Table 2 (100%)', 'mnist', 1.0, 'iid', [(98.2, (38, 72, 194, 445)),
                                                     (97.2, (9, 18, 31, 28))]),
    _setting('Table 2 (100%)', 'emnistl', 1.0, 'iid', [(94.6, (65, 414, 307, '1000+')),
                                                       (93.6, (16, 36, 66, 62))]),
    _setting('Table 2 (100%)', 'cifar10', 1.0, 'dir0.6', [(84.0, (148, 1890, '1000+', '1000+')),
                                                          (80.3, (64, 392, 869, 724))]),
    _setting('Table 2 (100%)', 'cifar100', 1.0, 'dir0.6', [(51.0, (468, 1838, '1000+', '1000+')),
                                                           (40.6, (73, 206, 998, 592))]),
    _setting('Table 2 (100%)', 'mnist', 1.0, 'dir0.6', [(98.1, (39, 108, 157, 416)),
                                                        (97.1, (11, 24, 38, 34))]),
    _setting('Table 2 (100%)', 'emnistl', 1.0, 'dir0.6', [(94.9, (207, 552, 410, '1000+')),
                                                          (93.9, (20, 42, 73, 61))]),
    _setting('Table 2 (100%)', 'cifar10', 1.0, 'dir0.3', [(83.5, (223, 1762, '1000+', '1000+')),
                                                          (80.2, (70, 504, 705, '1000+'))]),
    _setting('Table 2 (100%)', 'cifar100', 1.0, 'dir0.3', [(50.5, (405, 1940, '1000+', '1000+')),
                                                           (41.0, (80, 224, 911, '1000+'))]),
    _setting('Table 2 (100%)', 'mnist', 1.0, 'dir0.3', [(98.1, (35, 76, 313, 458)),
                                                        (97.1, (10, 24, 49, 44))]),
    _setting('Table 2 (100%)', 'emnistl', 1.0, 'dir0.3', [(94.5, (65, 210, 492, '1000+')),
                                                          (93.5, (23, 46, 78, 69))]),
    _setting('Table 2 (100%)', 'shakespeare', 1.0, 'iid', [(46.4, (33, 74, 96, 113)),
                                                           (45.4, (28, 64, 59, 56))]),
    _setting('Table 2 (100%)', 'shakespeare', 1.0, 'noniid', [(47.3, (33, 70, 134, '150+')),
                                                              (46.3, (28, 62, 53, 64))]),
    # ---- Table 2, 10 % participation (CIFAR IID / Dir .3: see Table 1 above).
    _setting('Table 2 (10%)', 'mnist', 0.1, 'iid', [(98.2, (100, 142, 588, 362)),
                                                    (97.2, (31, 52, 49, 43))]),
    _setting('Table 2 (10%)', 'emnistl', 0.1, 'iid', [(94.6, (104, 160, 330, 210)),
                                                      (93.6, (58, 84, 69, 65))]),
    _setting('Table 2 (10%)', 'cifar10', 0.1, 'dir0.6', [(83.5, (403, 1618, '1000+', '1000+')),
                                                         (81.3, (189, 486, 977, 943))]),
    _setting('Table 2 (10%)', 'cifar100', 0.1, 'dir0.6', [(51.0, (521, 1910, '1000+', '1000+')),
                                                          (41.6, (170, 302, 931, 748))]),
    _setting('Table 2 (10%)', 'mnist', 0.1, 'dir0.6', [(98.1, (129, 194, 581, 361)),
                                                       (97.1, (37, 60, 57, 57))]),
    _setting('Table 2 (10%)', 'emnistl', 0.1, 'dir0.6', [(94.9, (192, 296, 306, '1000+')),
                                                         (93.9, (55, 102, 95, 86))]),
    _setting('Table 2 (10%)', 'mnist', 0.1, 'dir0.3', [(98.2, (90, 208, 428, 858)),
                                                       (97.2, (37, 68, 76, 61))]),
    _setting('Table 2 (10%)', 'emnistl', 0.1, 'dir0.3', [(94.4, (107, 178, 804, '1000+')),
                                                         (93.4, (58, 100, 81, 86))]),
    _setting('Table 2 (10%)', 'shakespeare', 0.1, 'iid', [(46.9, (63, 94, 138, 190)),
                                                          (45.9, (56, 76, 96, 75))]),
    _setting('Table 2 (10%)', 'shakespeare', 0.1, 'noniid', [(47.6, (63, 102, 169, 133)),
                                                             (46.6, (56, 82, 80, 66))]),
    # ---- Table 4, unbalanced (lognormal sizes, sigma 0.3), 100 devices, 10 %.
    _setting('Table 4 (unbalanced)', 'cifar10', 0.1, 'iid', [(84.0, (335, 1152, '1000+', '1000+')),
                                                             (82.3, (213, 548, 834, 834))],
             balanced=False),
    _setting('Table 4 (unbalanced)', 'cifar100', 0.1, 'iid', [(53.0, (386, 1656, '1000+', '1000+')),
                                                              (48.2, (209, 800, 968, 945))],
             balanced=False),
    _setting('Table 4 (unbalanced)', 'cifar10', 0.1, 'dir0.3',
             [(82.5, (524, 1998, '1000+', '1000+')), (80.1, (274, 652, 893, '1000+'))],
             balanced=False),
    _setting('Table 4 (unbalanced)', 'cifar100', 0.1, 'dir0.3',
             [(52.0, (503, 1928, '1000+', '1000+')), (47.3, (234, 942, 871, '1000+'))],
             balanced=False),
    # ---- Table 5, 1 % participation.
    _setting('Table 5 (1%)', 'cifar10', 0.01, 'iid', [(82.6, (660, 1544, 892, '1000+')),
                                                      (81.6, (543, 1150, 603, 707))]),
    _setting('Table 5 (1%)', 'cifar100', 0.01, 'iid', [(39.8, (409, 1982, 428, 512)),
                                                       (38.8, (396, 1862, 392, 454))]),
    _setting('Table 5 (1%)', 'mnist', 0.01, 'iid', [(98.3, (529, 956, 644, 451)),
                                                    (97.3, (145, 290, 151, 143))]),
    _setting('Table 5 (1%)', 'emnistl', 0.01, 'iid', [(94.9, (483, 1136, 826, '1000+')),
                                                      (93.9, (210, 554, 216, 238))]),
    _setting('Table 5 (1%)', 'cifar10', 0.01, 'dir0.6', [(81.0, (561, 1510, 977, 841)),
                                                         (80.0, (436, 1100, 673, 623))]),
    _setting('Table 5 (1%)', 'cifar100', 0.01, 'dir0.6', [(36.6, (355, 1996, 341, 352)),
                                                          (35.6, (342, 1876, 317, 342))]),
    _setting('Table 5 (1%)', 'mnist', 0.01, 'dir0.6', [(98.2, (486, 1502, 863, 754)),
                                                       (97.2, (180, 332, 199, 166))]),
    _setting('Table 5 (1%)', 'emnistl', 0.01, 'dir0.6', [(94.8, (405, 1230, 504, '1000+')),
                                                         (93.8, (195, 576, 256, 294))]),
    _setting('Table 5 (1%)', 'cifar10', 0.01, 'dir0.3', [(79.0, (590, 1580, 955, 738)),
                                                         (78.0, (452, 1272, 653, 497))]),
    _setting('Table 5 (1%)', 'cifar100', 0.01, 'dir0.3', [(36.1, (343, 1990, 317, 342)),
                                                          (35.1, (321, 1866, 294, 314))]),
    _setting('Table 5 (1%)', 'mnist', 0.01, 'dir0.3', [(98.2, (521, 954, 951, 974)),
                                                       (97.2, (157, 318, 169, 177))]),
    _setting('Table 5 (1%)', 'emnistl', 0.01, 'dir0.3', [(94.4, (442, 1860, 481, '1000+')),
                                                         (93.4, (241, 694, 286, 279))]),
    _setting('Table 5 (1%)', 'shakespeare', 0.01, 'iid', [(43.0, (170, 460, 188, 151)),
                                                          (42.0, (148, 342, 149, 142))]),
    _setting('Table 5 (1%)', 'shakespeare', 0.01, 'noniid', [(43.8, (158, 388, 159, 153)),
                                                             (42.8, (143, 318, 146, 145))]),
    # ---- Table 6, synthetic convex problem, 20 devices, 10 %: targets are TRAINING LOSS.
    _setting('Table 6', 'synthetic', 0.1, 'homogeneous', [(0.0603, (32, 70, 136, 49))], devices=20),
    _setting('Table 6', 'synthetic', 0.1, 'type1', [(1.5717, (17, 88, 20, 18))], devices=20),
    _setting('Table 6', 'synthetic', 0.1, 'type2', [(0.1205, (150, 164, 274, 275))], devices=20),
    _setting('Table 6', 'synthetic', 0.1, 'type3', [(0.0854, (34, 260, 79, 106))], devices=20),
)
# ------------------------------------------------------------ hyperparameters

TASKS = {  # dataset -> (task, model, examples in the training set)
    # The text's 394 units in the first FC layer (the code's 384: --model=cnn003).
    'cifar10': ('cifar10', 'cnn003_text', 50000),
    'cifar100': ('cifar100_split', 'cnn003_text', 50000),
    'mnist': ('mnist', 'mlp_200_200', 60000),           # App. A.2; models.MLP_003
    'emnistl': ('emnist_letters10', 'mlp_100_100', 48000),
    'shakespeare': ('shakespeare_003', 'lstm100', 200000),
    'synthetic': ('synthetic_logistic', 'logreg', 4000),
}
DATA = {
    'cifar10': "prepared tensorflow-datasets 'cifar10' under --cache_dir",
    'cifar100': "prepared tensorflow-datasets 'cifar100' under --cache_dir",
    'mnist': "prepared tensorflow-datasets 'mnist' under --cache_dir",
    'emnistl': "prepared tensorflow-datasets 'emnist/letters' under --cache_dir",
    'shakespeare': 'TFF shakespeare.sqlite (tff.simulation.datasets.shakespeare) in --cache_dir',
    'synthetic': None,
}
MS_PER_STEP = {'cifar10': 2.0, 'cifar100': 2.0, 'mnist': 0.5, 'emnistl': 0.5,
               'shakespeare': 6.0, 'synthetic': 0.2}


@dataclasses.dataclass(frozen=True)
class HP:
  batch: int
  lr: float
  weight_decay: float
  lr_decay: float
  epochs_fedavg: int
  epochs_feddyn: int
  alpha: float
  mu: float
  scaffold_k: int
  rounds: int
  choices: str = ''   # what App. A.2 does not state and we chose


def _hp(s: Setting) -> HP:
  full, p = s.participation == 1.0, s.participation
  if s.dataset == 'mnist':
    alpha = 0.03 if (p == 0.1 and s.split == 'iid') else 0.01
    return HP(50, 0.1, 1e-4, 1.0 if full else 0.998, 20 if full else 10, 50, alpha, 1e-4,
              600, 500 if full else 1000,
              'FedProx epochs not stated: as FedAvg (reference code).' + (
                  '' if full else ' Rounds for partial participation not stated: 1000.'))
  if s.dataset == 'emnistl':
    if full:
      alpha = 0.005
    else:
      alpha = {(0.1, 'iid'): 0.003, (0.01, 'iid'): 0.003, (0.1, 'dir0.6'): 0.005,
               (0.01, 'dir0.3'): 0.005, (0.01, 'dir0.6'): 0.001, (0.1, 'dir0.3'): 0.01}[
                   (p, s.split)]
    return HP(50, 0.1, 1e-4, 1.0 if full else 0.998, 20 if full else 10, 50, alpha, 1e-4,
              500, 1000,
              'lr decay 0.998 read as partial-participation only (full: none, as MNIST); '
              'rounds 1000 (Table 2 prints "1000+").')
  if s.dataset in ('cifar10', 'cifar100'):
    per_client = TASKS[s.dataset][2] // s.devices
    if s.dataset == 'cifar100' and s.devices == 500:
      return HP(50, 0.1, 1e-3, 1.0, 2, 2, 0.01, 1e-4, 2 * math.ceil(per_client / 50), 2000,
                'lr decay not stated for 500 devices: none.')
    if s.dataset == 'cifar100' and not s.balanced:
      return HP(50, 0.1, 1e-3, 1.0, 2, 2, 0.1, 1e-4, 20, 1000,
                'lr decay not stated: none.')
    alpha = 0.1 if (s.dataset == 'cifar10' and p == 0.1 and s.split == 'iid'
                    and s.devices == 100 and s.balanced) else 0.01
    why = ('alpha = 0.1 (App. A.3: best for CIFAR-10 IID 10 %)' if alpha == 0.1 else
           'alpha = 0.01 (grid [1e-3, 1e-2, 1e-1], choice not stated; reference example)')
    return HP(50, 0.1, 1e-3, 1.0, 5, 5, alpha, 1e-4, 5 * math.ceil(per_client / 50),
              2000 if s.devices == 1000 else 1000,
              f'{why}; mu = 1e-4 (grid [1e-2, 1e-3, 1e-4], not stated; reference example); '
              'lr decay 1.0 (grid [0.992, 0.998, 1.0], not stated; reference example).')
  if s.dataset == 'shakespeare':
    alpha = {1.0: 0.009, 0.1: 0.015, 0.01: 0.001}[p]
    return HP(100, 1.0, 1e-4, 0.998 if p == 0.01 else 1.0, 5, 5, alpha, 1e-4, 100,
              150 if full else 250,
              'Rounds (not stated): 150 for full participation (Table 2 prints "150+"; '
              'Fig. 10 plots 140), 250 for 10 % and 1 % (the length of Fig. 10\'s curves).')
  # synthetic: App. A.1 grids; values of the reference code's example_synthetic.py.
  return HP(10, 0.1, 1e-5, 1.0, 10, 10, 0.01, 1e-4, 200, 500,
            'App. A.1 gives grids only (lr [1, .1], epochs [1, 10, 50], alpha [.1, .01, .001], '
            'K [20, 200, 1000], mu [.01, .0001]); values of the reference example_synthetic.py '
            '(lr .1, 10 epochs, alpha .01, K 200 = 10 epochs x 20 batches, mu 1e-4, 500 rounds).')


def _runs(hp: HP) -> tuple[Run, ...]:
  # All four: clipping and weight decay (reference code), the device average evaluated.
  shared = dict(clip_norm=10.0, client_weight_decay=hp.weight_decay,
                report_device_average=True)
  return (
      Run('feddyn', 'feddyn', dict(
          client_learning_rate=hp.lr, client_lr_decay=hp.lr_decay,
          client_epochs_per_round=hp.epochs_feddyn, feddyn_alpha=hp.alpha,
          feddyn_adaptive_alpha=True, feddyn_weight_decay_form=True, **shared)),
      Run('scaffold', 'scaffold', dict(
          client_learning_rate=hp.lr, client_lr_decay=hp.lr_decay, local_steps=hp.scaffold_k,
          server_learning_rate=1.0, scaffold_reference_conventions=True, **shared)),
      Run('fedavg', 'fedavg', dict(
          client_learning_rate=hp.lr, client_lr_decay=hp.lr_decay,
          client_epochs_per_round=hp.epochs_fedavg, **shared)),
      Run('fedprox', 'fedprox', dict(
          client_learning_rate=hp.lr, client_lr_decay=hp.lr_decay,
          client_epochs_per_round=hp.epochs_fedavg, prox_mu=hp.mu, **shared)),
  )


def _task_flags(s: Setting) -> dict:
  task, model, _ = TASKS[s.dataset]
  flags = dict(model=model)
  if s.dataset == 'synthetic':
    flags.update(synthetic_heterogeneity=s.split)
    return flags
  flags.update(num_clients=s.devices)
  if s.dataset == 'shakespeare':
    flags.update(partition='natural' if s.split == 'noniid' else 'iid')
    return flags
  flags.update(partition='iid' if s.split == 'iid' else 'dirichlet')
  if s.split.startswith('dir'):
    flags.update(dirichlet_alpha=float(s.split[3:]))
  if not s.balanced:
    flags.update(unbalanced_sigma=0.3)
  return flags


def _published(s: Setting) -> tuple[tuple[Published, ...], list[str]]:
  published, unreached = [], []
  if s.dataset == 'synthetic':
    for target, values in s.rows:
      unreached.append(f'training loss {target:g}: ' + ', '.join(
          f'{a} {v}' for a, v in zip(ALGORITHMS, values)))
    return (), unreached
  for target, values in s.rows:
    for algorithm, value in zip(ALGORITHMS, values):
      if isinstance(value, str):
        unreached.append(f'{algorithm} {value} at {target:g} %')
        continue
      published.append(Published(
          f'{algorithm}/models_to{target / 100:.4g}', float(value), s.tables,
          label=f'{algorithm}: models transmitted to {target:g} % test accuracy'))
  return tuple(published), unreached


def _experiment(s: Setting) -> Experiment:
  hp = _hp(s)
  task, model, n = TASKS[s.dataset]
  m = max(1, round(s.participation * s.devices))
  published, unreached = _published(s)
  per_client = n / s.devices
  steps_per_epoch = math.ceil(per_client / hp.batch)
  steps = hp.rounds * m * steps_per_epoch * (
      hp.epochs_feddyn + 2 * hp.epochs_fedavg) + hp.rounds * m * hp.scaffold_k
  hours = steps * MS_PER_STEP[s.dataset] / 3.6e6
  split = {'iid': 'IID', 'noniid': 'natural (one device per role) split', 'dir0.6': 'Dirichlet(0.6)',
           'dir0.3': 'Dirichlet(0.3)'}.get(s.split, f'{s.split} heterogeneity')
  notes = [f'Choices: {hp.choices}'] if hp.choices else []
  if unreached:
    notes.append(('Table 6 (targets on the TRAINING loss, no such metric here): '
                  if s.dataset == 'synthetic' else 'Not reached within the budget '
                  '(printed "N+", not compared): ') + '; '.join(unreached) + '.')
  notes.append('All four methods: local gradient clipped to norm 10, then weight decay '
               f'{hp.weight_decay:g} (reference code); FedProx with FedAvg\'s epochs and lr '
               'decay; the evaluated model is the average of all device models (paper, '
               'App. A.2), its upload counted.')
  if s.dataset == 'shakespeare':
    notes.append('LEAF samples from TFF\'s Shakespeare roles (80 characters -> the next; '
                 '100 devices x 2,000, 400 test samples each; '
                 + ('one role per device' if s.split == 'noniid' else
                    'all roles\' samples dealt out at random') + '), Embedding 8 + '
                 '2 x LSTM 100. The paper regenerates its test set per split from LEAF\'s '
                 'per-role train/test files; ours comes from TFF\'s per-role test texts.')
  if s.dataset in ('cifar10', 'cifar100'):
    notes.append('CNN: the text\'s 394 units in the first FC layer (cnn003_text); the '
                 'authors\' code has 384 (--model=cnn003).')
  rows = '; '.join(f'{t:g}: ' + ', '.join(f'{a} {v}' for a, v in zip(ALGORITHMS, vals))
                   for t, vals in s.rows)
  return Experiment(
      name=s.name,
      paper=PAPER,
      ref=s.tables,
      description=(f'{s.dataset}, {s.devices} devices, {s.participation:.0%} participation, '
                   f'{split}, {"balanced" if s.balanced else "unbalanced (lognormal sigma 0.3)"}'
                   f': FedDyn (alpha {hp.alpha:g}, {hp.epochs_feddyn} epochs), SCAFFOLD '
                   f'(K = {hp.scaffold_k}), FedAvg and FedProx ({hp.epochs_fedavg} epochs; '
                   f'FedProx mu {hp.mu:g}); lr {hp.lr:g}, B = {hp.batch}, {hp.rounds} rounds. '
                   f'Published models-to-target: {rows}.'),
      runner=TrainerRuns(
          task=task, task_flags=_task_flags(s), runs=_runs(hp),
          # Each device joins with probability p, redrawn while none joins (App. B.1;
          # the authors' code): at 1 % of 100 devices ~1.58 a round, not exactly 1.
          common_flags=dict(client_batch_size=hp.batch,
                            **({'participation_prob': s.participation}
                               if s.participation < 1 else {})),
          total_rounds=hp.rounds, clients_per_round=m, seeds=(0,), rounds_per_eval=1,
          smoke_task='synthetic_logistic' if s.dataset == 'synthetic' else 'feddyn_digits',
          smoke_task_flags=(dict(synthetic_heterogeneity=s.split) if s.dataset == 'synthetic'
                            else dict(partition='dirichlet', dirichlet_alpha=0.3))),
      published=published,
      expected_runtime=(f'~{max(hours, 0.05):.1f} h on one GPU: {steps / 1e6:.1f} M client '
                        f'steps (rounds x M x local steps, 4 runs) at ~{MS_PER_STEP[s.dataset]:g}'
                        ' ms/step, plus an evaluation every round (assumed, not measured)'),
      notes=' '.join(notes),
      data=DATA[s.dataset],
  )


ALL_EXPERIMENTS: tuple[Experiment, ...] = tuple(_experiment(s) for s in ALL_SETTINGS)
assert len({e.name for e in ALL_EXPERIMENTS}) == len(ALL_EXPERIMENTS), 'names must be unique'
EXPERIMENTS: tuple[Experiment, ...] = tuple(
    e for s, e in zip(ALL_SETTINGS, ALL_EXPERIMENTS) if s.dataset != 'synthetic')


# ---- Table 6 end to end (synthetic convex problem, offline): one binary runs the
# whole App. A.1 grid for the four methods and four settings over several draws.
from experiments.configs.base import Binary  # pylint: disable=g-import-not-at-top,wrong-import-position

_TABLE6_SETTINGS = ('homogeneous', 'type1', 'type2', 'type3')
_TABLE6_MODELS = ((32, 70, 136, 49), (17, 88, 20, 18), (150, 164, 274, 275),
                  (34, 260, 79, 106))
TABLE6 = Experiment(
    name='feddyn_synthetic_table6',
    paper=PAPER,
    ref='Table 6 (App. A.1)',
    description=('Synthetic convex problem of App. A.1 (20 devices, ~200 points, 30 features, '
                 '5 classes, logistic model, B = 10, weight decay 1e-5, each device joins with '
                 'probability 0.1): the full grid (lr {1, .1}, E {1, 10, 50}, alpha {.1, .01, '
                 '.001}, SCAFFOLD K {20, 200, 1000}, mu {.01, 1e-4}) for FedDyn, SCAFFOLD, FedAvg, '
                 'FedProx in 4 settings x 3 draws; best configuration per method; models '
                 'transmitted until the training loss reaches the printed target, and a target at '
                 'the paper\'s distance above each draw\'s own optimum.'),
    runner=Binary(module='experiments.table6', flags=dict(scale='full'),
                  smoke_flags=dict(scale='smoke')),
    published=tuple(
        Published(f'table.{setting}.{method}.mean', value, 'Table 6',
                  label=f'{setting}: {method} models to the printed target loss '
                        '(mean over draws)', to_target=True)
        for setting, values in zip(_TABLE6_SETTINGS, _TABLE6_MODELS)
        for method, value in zip(ALGORITHMS, values)),
    expected_runtime=('~17 min on 2 CPU cores (measured whole, --jobs=2: 17:11 wall, 32 '
                      'CPU-min; scoring the device average and the server model)'),
    notes=('Our draws are not the paper\'s: its printed targets sit at different distances '
           'from our optima (homogeneous: 0.0603 is about our MEAN optimal loss, so half the '
           'draws cannot reach it); table_own_optimum in the binary\'s result.json uses each '
           'draw\'s optimum plus the paper\'s distance. Clipping at norm 10 and the zero '
           'initial model follow the reference code; FedDyn runs Algorithm 1 (no adaptive '
           'alpha).'),
    data='nothing (generated offline)',
)
EXPERIMENTS = EXPERIMENTS + (TABLE6,)
