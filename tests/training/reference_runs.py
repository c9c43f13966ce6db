"""Reference runs shared by the hostile-input and full-disk tests (made once
per session, whichever module asks first): an uninterrupted FedAvg and FedDyn
run on test_faults.py's settings, and a FedDyn run that died in round 5.
Import `reference_runs` into a test module to use it."""

import pytest

_MADE = []  # the runs, once made


@pytest.fixture(scope='session')
def reference_runs(tmp_path_factory):
  """(name -> (uninterrupted run dir, its result, run dir that died in round
  5; the died run for feddyn only), algorithms, task), as test_faults.py's."""
  if not _MADE:
    _MADE.append(_make(tmp_path_factory))
  return _MADE[0]


def _make(tmp_path_factory):
  import test_faults as faults
  from tasks import TaskOptions, get_task
  from tff_algos.flags import algorithm_flags
  task = get_task('digits', TaskOptions(batch_size=16, num_clients=10, model='logistic'))
  algorithms = {name: algorithm_flags.build(name, task.model_fn, algorithm_flags.for_algorithm(
      name, algorithm_flags.HParams(local_steps=3, feddyn_alpha=0.1)))
                for name in faults.ALGORITHMS}
  out = {}
  for name, algorithm in algorithms.items():
    root = tmp_path_factory.mktemp(f'reference_{name}')
    full = faults.training.run_training(algorithm, task, faults.config(str(root / 'full')))
    died = None
    if name == 'feddyn':
      died = root / 'died'
      with pytest.raises(faults.Died):
        faults.training.run_training(algorithm, task, faults.config(str(died)),
                                     round_callback=faults._die_in_5)  # pylint: disable=protected-access
    out[name] = (root / 'full', full, died)
  return out, algorithms, task
