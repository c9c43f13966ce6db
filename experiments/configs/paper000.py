"""Paper 000: Mills et al., "Faster Federated Learning with Decaying Number of
Local SGD Steps" (ICLR 2021 submission, anonymous): §3 Fig. 1, §4 Figs. 2-4 and
Table 1 (hyperparameters: App. B, Tables 4-5).

Experiments:
* `decaying_k_quadratic_fig1`: the 1-D quadratic toy of §3 (binary
  `experiments.quadratic_toy`; Fig. 1 (a) and (b)).
* `decaying_k_stackoverflow_table1`, `decaying_k_femnist_table1`,
  `decaying_k_shakespeare_table1`: for each dataset the three K of Table 1 with
  constant gamma/K (Figs. 2-4 (a)), decaying gamma (b) and decaying K (c), with
  the per-scheme hyperparameters of Table 5; 4000 rounds, C = 1 % of the
  clients per round, B = 32, 5 seeds, evaluated every 40 rounds. Those listed
  by the runner hold Table 1's runs (decaying gamma and K); the constant-gamma/K
  runs (panels (a), no published number) are `decaying_k_stackoverflow_fig2a`,
  `decaying_k_femnist_fig3a` and `decaying_k_shakespeare_fig4a`;
  `ALL_EXPERIMENTS` has each dataset's nine runs in one experiment.

Every row of Table 1 is compared: "Max Test Acc" (the highest test accuracy
seen during training, `max_accuracy`; every evaluation of a run uses the same
test set, so it is the peak of one curve), "Min Train Error" (the lowest
200-round moving average of the per-round training loss,
`min_train_loss_smooth200`: "error curves are smoothed over a window of size
200"; Table 1's decaying-K row says "Min Test Error", read as the caption's
"lowest training error") and "Fraction SGD Steps Used" (sum_t K_t / (4000
K0) of the decaying-K runs, `fraction_sgd_steps`). The last is deterministic
and checks our reading of Table 5: 0.551 / 0.514 / 0.504 for K0 = 10 / 33 /
100 at d_K = 0.9996 (paper: 0.55 / 0.51 / 0.50), 0.647 for K0 = 3 (0.65), and
0.260 for K0 = 33 at d_K = 0.999 (0.26; K0 = 100 would give 0.250): so
FEMNIST's third K is 33, as Table 1 says, not 100 as Table 5's row label says.

Data differences (closest available, see each experiment's notes): the paper
uses LEAF's FEMNIST / Shakespeare with 20 % of each user's samples held out;
we use TFF's federated EMNIST-62 and Shakespeare with their own test splits.
"""

from __future__ import annotations

import dataclasses

from experiments.configs.base import Binary, Experiment, Published, Run, TrainerRuns
from tff_algos.core import schedules

PAPER = '000 Mills et al. 2021 (decaying K)'
ROUNDS = 4000
ROUNDS_PER_EVAL = 40      # "accuracy measured every 40 rounds"
SEEDS = (0, 1, 2, 3, 4)   # "Each curve is an average over 5 trials"
BATCH = 32                # App. B
CLIENTS_PER_ROUND = 10    # C = 0.01 of 1000 training clients


def _client_steps(k0: int, d_k: float = 1.0, rounds: int = ROUNDS) -> int:
  """Client steps per client slot over `rounds`: sum_t K_t, as the trainer runs them."""
  return schedules.LocalSteps(k0, d_k).total(rounds)


# ------------------------------------------------------------------ §3 Fig. 1

QUADRATIC = Experiment(
    name='decaying_k_quadratic_fig1',
    paper=PAPER,
    ref='§3, Fig. 1 (a), (b)',
    description=(
        'FedSGD on f(x; z) = z x^2 / 2 - x, client z on [1, 3] with density ~ z^-1/2, '
        'M = 10, B = 1, gamma = 0.1, eta = 0.001, x_1 = 0.4, 10 runs averaged, 3000 rounds. '
        '(a) constant K in {3, 10, 33} and decaying gamma (d_gamma = 0.995, K = 10); '
        '(b) K_0 = 10 with d_K in {0.99, 0.995, 0.9995}.'),
    runner=Binary(
        module='experiments.quadratic_toy',
        flags=dict(rounds=3000, seeds=10, server_learning_rate=0.001,
                   client_learning_rate=0.1, clients_per_round=10,
                   runs='const_k3,const_k10,const_k33,decay_gamma,decay_k_0.99,decay_k,'
                        'decay_k_0.9995'),
        smoke_flags=dict(rounds=20, seeds=2, runs='const_k10,decay_k')),
    published=(
        Published('x_star', 0.523, '§3 text ("x* ~ 0.523")',
                  label='true minimiser x* (paper rounds to 3 decimals)'),
        Published('final_x.decay_k', 0.523, '§3 text and Fig. 1 (b)', approximate=True,
                  label='d_K = 0.995 "converges fastest to x*": final x ~ x* (our reading of '
                        'the text; the figure is not in the text extraction)'),
        Published('client_steps.decay_k', round(0.16 * 3000 * 10), '§3 text', approximate=True,
                  label='client steps per slot, d_K = 0.995: "84% less total SGD steps" than '
                        'constant K = 10 over 3000 rounds (16% of 30000; exact: '
                        f'{_client_steps(10, 0.995, 3000)})'),
    ),
    expected_runtime='~40-50 s wall on 2 idle cores (measured in full: 37.3 s, 41.5 s user + '
                     '16.2 s system; the 7 runs x 10 seeds as lanes of one stacked model)',
    notes=('The paper gives no per-run numbers beyond x* and the 84 % step saving; '
           'final_x of the constant-K runs should approach the surrogate minimisers '
           'x*(gamma, K) printed by the binary (0.53325 / 0.55703 / 0.57606), not x*.'),
    data=None,
)


# --------------------------------------------------- §4 Figs. 2-4, Table 1

def _runs(rows, uniform_weighting: bool = False, adam: bool = False):
  """rows: K -> (constant (eta0, d_eta, gamma), decaying-gamma (eta0, d_eta,
  gamma0, d_gamma), decaying-K (eta0, d_eta, gamma, d_K)); Table 5."""
  runs = []
  for k, (const, dec_g, dec_k) in rows.items():
    def server(eta0, d_eta):
      if adam:  # "Adam" in Table 5's d_eta column: FedAdam (App. B Alg. 3), no eta decay
        return dict(server_optimizer='adam', server_learning_rate=eta0,
                    server_beta_1=0.9, server_beta_2=0.999, server_epsilon=1e-8)
      return dict(server_optimizer='sgd', server_learning_rate=eta0, server_lr_decay=d_eta)
    common = dict(local_steps=k, uniform_weighting=uniform_weighting)
    runs.append(Run(f'const_K{k}', 'fedavg', dict(
        common, **server(const[0], const[1]), client_learning_rate=const[2])))
    runs.append(Run(f'decay_gamma_K{k}', 'fedavg', dict(
        common, **server(dec_g[0], dec_g[1]), client_learning_rate=dec_g[2],
        client_lr_decay=dec_g[3])))
    runs.append(Run(f'decay_K_K{k}', 'fedavg', dict(
        common, **server(dec_k[0], dec_k[1]), client_learning_rate=dec_k[2],
        local_steps_decay=dec_k[3])))
  return tuple(runs)


SMOOTHING = 200           # "Error curves are smoothed over a window of size 200"


def _table1(max_acc, min_train, fraction, what='Max Test Acc'):
  """Table 1's columns of one dataset: K -> (decaying gamma, decaying K) of its
  "Max Test Acc" and "Min Train Error" rows, K -> "Fraction SGD Steps Used"."""
  out = []
  rows = ((max_acc, 'max_accuracy', what),
          (min_train, f'min_train_loss_smooth{SMOOTHING}',
           f'Min Train Error ({SMOOTHING}-round moving average)'))
  for values, metric, label in rows:
    for k, (g, dk) in values.items():
      out.append(Published(f'decay_gamma_K{k}/{metric}', g, 'Table 1',
                           label=f'decaying gamma, K={k}: {label}'))
      out.append(Published(f'decay_K_K{k}/{metric}', dk, 'Table 1',
                           label=f'decaying K, K0={k}: {label}'))
  for k, value in fraction.items():
    out.append(Published(f'decay_K_K{k}/fraction_sgd_steps', value, 'Table 1',
                         label=f'decaying K, K0={k}: Fraction SGD Steps Used'))
  return tuple(out)


# Assumed GPU milliseconds a client step, per dataset (not measured).
MS_PER_STEP = {'stackoverflow': 1.0, 'femnist': 3.0, 'shakespeare': 5.0}


def _runtime_text(steps: int, num_runs: int, ms_per_step: float) -> str:
  """The expected runtime of `steps` client steps a seed over `num_runs` runs."""
  hours = steps * len(SEEDS) * ms_per_step / 3.6e6
  return (f'~{hours:.0f} h on one GPU: {steps * len(SEEDS) / 1e6:.1f} M client steps '
          f'(rounds x M x K_t over {num_runs} runs x {len(SEEDS)} seeds) at '
          f'~{ms_per_step:g} ms/step (assumed, not measured)')


def _runtime(ks, ms_per_step: float, decays) -> str:
  steps = sum(CLIENTS_PER_ROUND * (_client_steps(k) * 2 + _client_steps(k, d))
              for k, d in zip(ks, decays))
  return _runtime_text(steps, 9, ms_per_step)


# StackOverflow tag prediction: FedAdam (server Adam, eta_0 = 0.3 = its alpha,
# beta = (.9, .999), eps = 1e-8, uniform mean of client updates, App. B Alg. 3).
SO_ROWS = {
    10: ((0.3, None, 1.0), (0.3, None, 1.0, 0.999), (0.3, None, 1.0, 0.9996)),
    33: ((0.3, None, 1.0), (0.3, None, 1.0, 0.999), (0.3, None, 1.0, 0.9996)),
    100: ((0.3, None, 1.0), (0.3, None, 1.0, 0.9996), (0.3, None, 1.0, 0.9996)),
}
STACKOVERFLOW = Experiment(
    name='decaying_k_stackoverflow_table1',
    paper=PAPER,
    ref='Fig. 2 (a)-(c), Table 1 (StackOverflow), Table 5',
    description=(
        'StackOverflow tag prediction (1-vs-rest logistic regression, 10k-word bag of words '
        '-> 500 tags, Recall@5) with FedAdam: constant gamma/K, decaying gamma and decaying K '
        'for K in {10, 33, 100}; 1000 training clients with at most 250 samples each, a '
        'fixed 10,000-sample test set, 10 clients per round, B = 32, 4000 rounds.'),
    runner=TrainerRuns(
        task='stackoverflow_tag',
        task_flags=dict(model='logreg_mean', num_clients=1000, max_client_examples=250,
                        test_examples=10000),
        runs=_runs(SO_ROWS, uniform_weighting=True, adam=True),
        common_flags=dict(client_batch_size=BATCH),
        total_rounds=ROUNDS, clients_per_round=CLIENTS_PER_ROUND, seeds=SEEDS,
        rounds_per_eval=ROUNDS_PER_EVAL),
    published=_table1({10: (0.37, 0.41), 33: (0.40, 0.46), 100: (0.44, 0.42)},
                      {10: (0.02, 0.02), 33: (0.02, 0.02), 100: (0.02, 0.02)},
                      {10: 0.55, 33: 0.51, 100: 0.50}, what='Max Test Recall@5'),
    expected_runtime=_runtime((10, 33, 100), MS_PER_STEP['stackoverflow'],
                              (0.9996, 0.9996, 0.9996)),
    notes=(
        'Published "accuracy" values are Recall@5 (tf.keras.metrics.Recall on the top-5 '
        'predictions; the runner reads the recall_at_5 eval metric). Per-client cap: App. B '
        'says 250 samples per client (used here, --max_client_examples=250: each client keeps '
        'its first 250 examples as stored), §4.1 says 500; App. B\'s total of 331,027 '
        'training samples over 1000 clients is impossible with a cap of 250. Test set: the '
        'first 10,000 examples of the TFF test split (--test_examples=10000), for the '
        'periodic and the final evaluations alike. num_clients=1000 picks 1000 TFF training '
        'clients at random (the paper does not say how its 1000 were chosen). Model '
        'logreg_mean: binary cross-entropy averaged over the batch as Keras does by default '
        "(the paper's TensorFlow code; TFF's baseline, model=logreg, sums over the batch, "
        'which multiplies the client step by B = 32 and the training loss by 32). FedAdam '
        "with bias-corrected step (Alg. 3 line 11) as tff's Adam; uniform client mean "
        '(Alg. 3 line 8).'),
    data='TFF stackoverflow.sqlite (tff.simulation.datasets.stackoverflow) in --cache_dir',
)

# FEMNIST: server SGD with decaying eta. The third K is 33 (Table 1; Table 5's
# row says 100, but d_K = 0.999 gives Table 1's 0.26 step fraction only for 33).
FEMNIST_ROWS = {
    3: ((1.0, 0.9996, 0.3), (1.0, 0.9996, 0.3, 0.9996), (1.0, 0.9996, 0.3, 0.9996)),
    10: ((1.0, 0.9996, 0.3), (1.0, 0.9996, 0.3, 0.9996), (1.0, 0.9996, 0.3, 0.9996)),
    33: ((1.0, 0.9996, 0.3), (1.0, 0.9996, 0.3, 0.9996), (1.0, 0.9996, 0.3, 0.999)),
}
FEMNIST = Experiment(
    name='decaying_k_femnist_table1',
    paper=PAPER,
    ref='Fig. 3 (a)-(c), Table 1 (FEMNIST), Table 5',
    description=(
        'FEMNIST (62 classes) with the CNN of App. B Table 2 and FedSGD (server SGD, '
        'eta_t = eta_0 d_eta^t): constant gamma/K, decaying gamma and decaying K for K in '
        '{3, 10, 33}; 1000 training clients, 10 per round, B = 32, 4000 rounds.'),
    runner=TrainerRuns(
        task='emnist_character',
        task_flags=dict(model='femnist_cnn', num_clients=1000),
        runs=_runs(FEMNIST_ROWS),
        common_flags=dict(client_batch_size=BATCH),
        total_rounds=ROUNDS, clients_per_round=CLIENTS_PER_ROUND, seeds=SEEDS,
        rounds_per_eval=ROUNDS_PER_EVAL),
    published=_table1({3: (0.91, 0.91), 10: (0.92, 0.92), 33: (0.91, 0.92)},
                      {3: (0.22, 0.23), 10: (0.11, 0.16), 33: (0.05, 0.14)},
                      {3: 0.65, 10: 0.55, 33: 0.26}),
    expected_runtime=_runtime((3, 10, 33), MS_PER_STEP['femnist'], (0.9996, 0.9996, 0.999)),
    notes=(
        'K = 3, 10, 33 as Table 1 (Table 5 labels the third row K = 100; the step fraction '
        '0.26 of Table 1 matches K0 = 33 with d_K = 0.999, see module docstring). Clients: '
        '§4.1 says 1000 training clients chosen at random, App. B says 2000 users; we use '
        '1000 (with C = 0.01: 10 per round). Paper data: LEAF FEMNIST (App. B says 32x32 '
        "images; LEAF's are 28x28), 20 % of each user's samples as test set; ours: TFF "
        'emnist_all (28x28) and its test split. App. B Table 2 lists a 64-way softmax '
        "output; femnist_cnn has 62 (the number of classes)."),
    data='TFF emnist_all.sqlite (tff.simulation.datasets.emnist) in --cache_dir',
)

SHAKESPEARE_ROWS = {
    10: ((1.0, 0.9996, 1.0), (1.0, 0.9996, 1.0, 0.9996), (1.0, 0.9996, 1.0, 0.9996)),
    33: ((1.0, 0.999, 1.0), (1.0, 0.999, 1.0, 0.999), (1.0, 0.999, 1.0, 0.9996)),
    100: ((1.0, 0.996, 1.0), (1.0, 0.996, 1.0, 0.996), (1.0, 0.996, 1.0, 0.9996)),
}
SHAKESPEARE = Experiment(
    name='decaying_k_shakespeare_table1',
    paper=PAPER,
    ref='Fig. 4 (a)-(c), Table 1 (Shakespeare), Table 5',
    description=(
        'Shakespeare next-character prediction with the 2 x GRU-256 model of App. B Table 3 '
        'and FedSGD (server SGD, decaying eta): constant gamma/K, decaying gamma and decaying '
        'K for K in {10, 33, 100}; 10 clients per round, B = 32, 4000 rounds.'),
    runner=TrainerRuns(
        task='shakespeare_character',
        task_flags=dict(model='gru'),
        runs=_runs(SHAKESPEARE_ROWS),
        common_flags=dict(client_batch_size=BATCH),
        total_rounds=ROUNDS, clients_per_round=CLIENTS_PER_ROUND, seeds=SEEDS,
        rounds_per_eval=ROUNDS_PER_EVAL),
    published=_table1({10: (0.55, 0.54), 33: (0.57, 0.56), 100: (0.57, 0.58)},
                      {10: (1.33, 1.44), 33: (1.12, 1.23), 100: (0.87, 0.84)},
                      {10: 0.55, 33: 0.51, 100: 0.50}),
    expected_runtime=_runtime((10, 33, 100), MS_PER_STEP['shakespeare'],
                              (0.9996, 0.9996, 0.9996)),
    notes=(
        "Paper: LEAF Shakespeare, the 1000 roles with most samples, last 20 % of each role's "
        'lines as test set, 77-character vocabulary; ours: TFF shakespeare (715 roles, all '
        'used, its own test split, 90-token vocabulary), 10 clients per round (the paper\'s '
        "C = 0.01 of 1000)."),
    data='TFF shakespeare.sqlite (tff.simulation.datasets.shakespeare) in --cache_dir',
)



def _figure(exp: Experiment) -> str:
  """'Fig. 2' of an experiment whose ref starts 'Fig. 2 (a)-(c)'."""
  return exp.ref.split(' (a)')[0]


def _panel_a_name(exp: Experiment) -> str:
  """The name of `exp`'s panel-(a) experiment (`_constant_only`)."""
  return exp.name.replace('_table1', f'_fig{_figure(exp)[-1]}a')


def _decaying_only(exp: Experiment) -> Experiment:
  """`exp` without its constant-gamma/K runs (panels (a), no published number)."""
  runner = dataclasses.replace(exp.runner, runs=tuple(
      r for r in exp.runner.runs if not r.label.startswith('const_')))
  return dataclasses.replace(
      exp, runner=runner, ref=exp.ref.replace('(a)-(c)', '(b), (c)'),
      description=exp.description.replace(
          'constant gamma/K, decaying gamma and decaying K', 'decaying gamma and decaying K'),
      notes=exp.notes + f' The constant-gamma/K runs of panel (a) are the experiment '
                        f'{_panel_a_name(exp)}.')


def _constant_only(exp: Experiment, ms_per_step: float) -> Experiment:
  """`exp`'s constant-gamma/K runs alone: its figure's panel (a), as an
  experiment of its own (no published number; the curves)."""
  runs = tuple(r for r in exp.runner.runs if r.label.startswith('const_'))
  figure = _figure(exp)
  steps = sum(CLIENTS_PER_ROUND * _client_steps(r.flags['local_steps']) for r in runs)
  return dataclasses.replace(
      exp, name=_panel_a_name(exp),
      runner=dataclasses.replace(exp.runner, runs=runs),
      ref=f'{figure} (a), Table 5',
      description=exp.description.replace(
          'constant gamma/K, decaying gamma and decaying K', 'constant gamma/K (panel (a))'),
      published=(),
      expected_runtime=_runtime_text(steps, len(runs), ms_per_step),
      notes=exp.notes + f' Panel (a) of {figure}: the constant-gamma/K runs, which Table 1 '
                        f'does not report; {exp.name} has the decaying runs.')


# The complete transcription (constant, decaying gamma and decaying K runs).
ALL_EXPERIMENTS: tuple[Experiment, ...] = (QUADRATIC, STACKOVERFLOW, FEMNIST, SHAKESPEARE)
# What the runner lists: Table 1's runs (decaying gamma and K, with published
# numbers), and each figure's panel (a) (constant gamma/K) as an experiment of
# its own, so that a Table 1 reproduction does not also run panel (a).
EXPERIMENTS: tuple[Experiment, ...] = (QUADRATIC,) + tuple(
    _decaying_only(e) for e in ALL_EXPERIMENTS[1:]) + tuple(
        _constant_only(e, MS_PER_STEP[dataset]) for e, dataset in zip(
            ALL_EXPERIMENTS[1:], ('stackoverflow', 'femnist', 'shakespeare')))
