"""Flag values a hostile or careless user gives: each refused in one `error:`
line naming the flag, before TensorFlow loads, with nothing left behind."""

import os

import pytest

from binaries import assert_refused, run_binary


@pytest.mark.parametrize('argv,fragment', [
    # Accepted, then every client was reported diverged.
    (['--algorithm=local_update', '--theta=1,nan'], '--theta) needs finite non-negative'),
    (['--algorithm=local_update', '--theta=0.5,inf'], '--theta) needs finite non-negative'),
    (['--algorithm=fedprox', '--prox_mu=inf'], '--prox_mu must be a finite number >= 0'),
    # An integer flag beyond what TensorFlow counts in: trained for ever.
    (['--total_rounds=100000000000000000000'], '--total_rounds must be at most 2147483647'),
    (['--rounds_per_eval=3000000000'], '--rounds_per_eval must be at most 2147483647'),
    # Blamed on --root_output_dir after TensorFlow had loaded.
    (['--experiment_name=' + 'a' * 256], '--experiment_name is 256 bytes long'),
    (['--experiment_name=' + 'é' * 128], '--experiment_name is 256 bytes long'),
])
def test_a_hostile_flag_value_is_refused_in_one_line(tmp_path, argv, fragment):
  res = run_binary('train', *argv, f'--root_output_dir={tmp_path / "out"}', cwd=tmp_path)
  assert_refused(res, fragment)
  assert not (tmp_path / 'out').exists()  # refused before the root was made


def test_the_longest_experiment_name_is_accepted(tmp_path):
  res = run_binary('train', '--experiment_name=' + 'a' * 255, '--total_rounds=0',
                   f'--root_output_dir={tmp_path}', cwd=tmp_path)
  assert_refused(res, '--total_rounds must be >= 1')  # the name passed its check


@pytest.mark.parametrize('binary,flag', [('train', 'experiment_name'), ('grid', 'grid_name')])
def test_a_run_directory_that_is_a_file_is_refused_naming_it(tmp_path, binary, flag):
  (tmp_path / 'taken').write_text('a file of the user\n')
  extra = ['--grid=client_learning_rate=0.1,0.3'] if binary == 'grid' else []
  res = run_binary(binary, f'--root_output_dir={tmp_path}', f'--{flag}=taken', *extra,
                   cwd=tmp_path)
  line = assert_refused(res, f'--{flag} names {tmp_path / "taken"}', 'is a file')
  assert 'root_output_dir' not in line
  assert (tmp_path / 'taken').read_text() == 'a file of the user\n'
  assert sorted(os.listdir(tmp_path)) == ['taken']


SMALL = ['--task=digits', '--model=logistic', '--clients_per_round=3', '--local_steps=2',
         '--client_batch_size=16', '--rounds_per_eval=0', '--noprogress']


def test_a_run_started_under_other_algorithm_defaults_is_refused(tmp_path):
  """A version whose LocalUpdate default eta was 1 resumed its runs at 0.1 without
  a word: the run's identity records the algorithm's own defaults."""
  import json
  argv = ['--algorithm=local_update', *SMALL, '--total_rounds=1',
          f'--root_output_dir={tmp_path}', '--experiment_name=run']
  first = run_binary('train', *argv, cwd=tmp_path, timeout=300)
  assert first.returncode == 0, first.stderr[-3000:]
  path = tmp_path / 'run' / 'run_identity.json'
  identity = json.loads(path.read_text())
  assert identity['algorithm_defaults'] == {'server_learning_rate': 0.1}
  identity['algorithm_defaults'] = {}  # a version whose default was the flag's, 1.0
  path.write_text(json.dumps(identity))
  res = run_binary('train', *argv[:-3], '--total_rounds=2', *argv[-2:], cwd=tmp_path,
                   timeout=300)
  assert_refused(res, 'holds a different run (differs in: algorithm_defaults.'
                      'server_learning_rate (the default there, 0.1 here))',
                 before_tensorflow=False)
  del identity['algorithm_defaults']  # written before identities recorded them
  path.write_text(json.dumps(identity))
  res = run_binary('train', *argv[:-3], '--total_rounds=2', *argv[-2:], cwd=tmp_path,
                   timeout=300)
  assert res.returncode == 0 and 'resuming from round 1' in res.stdout, res.stderr[-3000:]
