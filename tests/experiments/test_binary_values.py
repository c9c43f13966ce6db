"""Bad values of the experiment binaries' own flags (comma-separated lists,
names, files) are one `error:` line that names the flag, the bad item and what
the flag takes, with exit status 2 and before TensorFlow loads: not Python's
"could not convert string to float: 'x'", not a `math domain error` traceback
after all the training (`local_update_decay --etas=0`), not an unknown name
dropped in silence after minutes (`benchmark --algorithms=nosuch`)."""

import pytest
from test_errors import assert_one_error_line, run, run_code


def run_main(binary: str, args: list[str]):
  """`python -m experiments.<binary> args` through its `main`, printing at the
  end whether TensorFlow was loaded (the expensive part: seconds of imports,
  then the data and the training)."""
  code = (f'import sys; sys.argv = {[binary, *args]!r}\n'
          f'from experiments import {binary}\nfrom experiments.lib import common\n'
          f'try:\n  common.run({binary}.main)\n'
          'finally:\n  print("TF loaded:", "tensorflow" in sys.modules)\n')
  # Old code trained (or benchmarked) for minutes on some of these: the
  # timeout fails them in a minute.
  return run_code(code, timeout=60)


# (binary, flags, output directory flag, fragments of the error line). Each
# names the flag; the first fragment is where the line starts.
BAD_VALUES = [
    # Every score was nan, with no word.
    ('grid', ['--grid=seed=0,1', '--select_last_rounds=0'], 'root_output_dir',
     ['error: flag --select_last_rounds=0: 0 is not a positive integer']),
    ('nastya', ['--eta_multipliers=1,x'], 'output_dir',
     ["error: --eta_multipliers: 'x' is not a number",
      'a comma-separated list of numbers > 0, e.g.']),
    ('nastya', ['--eta_multipliers=0.5,0'], 'output_dir',
     ["error: --eta_multipliers: '0' is not > 0"]),
    ('nastya', ['--runs=nosuch'], 'output_dir', ["error: --runs: unknown ['nosuch']"]),
    ('feddyn', ['--splits=iid,dirichlet:abc'], 'root_output_dir',
     ["error: --splits: 'dirichlet:abc': alpha 'abc' is not a number > 0", 'dirichlet:<alpha>']),
    ('feddyn', ['--splits=sorted'], 'root_output_dir',
     ["error: --splits: 'sorted' is not a split"]),
    ('feddyn', ['--targets=abc'], 'root_output_dir',
     ["error: --targets: 'abc' is not a number", 'e.g. 0.85,0.9']),
    ('feddyn', ['--run_seeds=0,a'], 'root_output_dir',
     ["error: --run_seeds: 'a' is not an integer", 'integers >= 0']),
    ('feddyn', ['--participations=0.1,x'], 'root_output_dir',
     ["error: --participations: 'x' is not a number", 'in (0, 1]']),
    ('feddyn', ['--unbalanced_sigmas=x'], 'root_output_dir',
     ["error: --unbalanced_sigmas: 'x' is not a number"]),
    ('local_update_decay', ['--gammas=x'], 'root_output_dir',
     ["error: --gammas: 'x' is not a number", '>= 0']),
    ('local_update_decay', ['--gammas=0,-1'], 'root_output_dir',
     ["error: --gammas: '-1' is not >= 0"]),
    # The review's case: rc 1 and a traceback from log10(0) after the training.
    ('local_update_decay', ['--etas=0', '--rounds=2', '--tasks=emnist_character'],
     'root_output_dir', ["error: --etas: '0' is not > 0", 'e.g. 0.01,0.1']),
    ('local_update_decay', ['--etas=0.1,nan'], 'root_output_dir',
     ["error: --etas: 'nan' is not a finite number"]),
    ('local_update_decay', ['--figure=fig2', '--fixed_eta=0', '--tasks=emnist_character'],
     'root_output_dir', ['error: --fixed_eta must be a number > 0']),
    ('local_update_decay', ['--norm_block_rounds=0'], 'root_output_dir',
     ['error: --norm_block_rounds must be >= 1']),
    ('fedgbo', ['--algorithms=fedavg,nosuch'], 'root_output_dir',
     ["error: --algorithms: unknown algorithm 'nosuch'", 'fedprox']),
    ('fedgbo', ['--tasks=nosuch'], 'root_output_dir',
     ["error: --tasks: unknown task preset 'nosuch'", 'femnist']),
    # Known names listed; before: (c) filtered the registry by it, rc 0 after 82 s.
    ('benchmark', ['--quick', '--algorithms=fedavg,nosuch'], None,
     ["error: --algorithms: unknown algorithm 'nosuch'; choose from ", 'fedprox', 'scaffold']),
]


@pytest.mark.parametrize('binary,args,output_flag,fragments', BAD_VALUES,
                         ids=[f'{b} {a[0]}' for b, a, _, _ in BAD_VALUES])
def test_a_bad_list_item_is_one_line_naming_the_flag_before_tensorflow(
    tmp_path, binary, args, output_flag, fragments):
  """Refused from the flags alone: no TensorFlow, no output directory. An
  empty --cache_dir keeps the old code's runs from finding (or fetching) data."""
  out = tmp_path / 'out'
  extra = [f'--{output_flag}={out}'] if output_flag else []
  if binary == 'local_update_decay':
    extra.append(f'--cache_dir={tmp_path}')
  res = run_main(binary, args + extra)
  assert_one_error_line(res, *fragments)
  assert 'TF loaded: False' in res.stdout, res.stdout[-2000:]
  assert not out.exists()


def test_a_missing_libsvm_file_is_named_with_the_fix(tmp_path):
  """The loader's message named the file only; the line now says what the flag
  takes, where the paper's file comes from, and how to run without it."""
  missing = tmp_path / 'mushrooms'
  res = run_main('nastya', [f'--libsvm_path={missing}', f'--output_dir={tmp_path}/out'])
  assert_one_error_line(res, f"error: --libsvm_path: cannot read '{missing}'",
                        'No such file or directory', 'LIBSVM-format file',
                        'https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/',
                        'leave the flag out')
  assert 'TF loaded: False' in res.stdout, res.stdout[-2000:]


def test_a_misspelt_experiment_suggests_the_names_closest_to_the_whole_name():
  """Matching on the first '_' word only offered ten cifar experiments for a
  typo at the end of an emnist name."""
  from experiments import configs
  with pytest.raises(ValueError) as raised:
    configs.get('fedopt_baselines_emnist_cr_fedavgg')
  similar = str(raised.value).split('similar: ')[1].split(', ')
  assert similar[0] == 'fedopt_baselines_emnist_cr_fedavg'
  assert not any('cifar' in name for name in similar), similar
  # With no close name, those of the same family (the first word) are offered.
  assert configs.similar_names('nastya', list(configs.all_experiments())) == [
      'nastya_mushrooms_fig2', 'nastya_cifar10_lenet_fig2']


def test_reproduce_names_the_flag_of_an_unknown_experiment():
  res = run(['experiments.reproduce', '--experiment=fedopt_baselines_emnist_cr_fedavgg'],
            timeout=60)
  assert_one_error_line(res, "error: --experiment: unknown experiment "
                        "'fedopt_baselines_emnist_cr_fedavgg'",
                        'similar: fedopt_baselines_emnist_cr_fedavg,')


@pytest.mark.parametrize('mode', ['--list', '--report'])
def test_reproduce_list_and_report_refuse_an_unknown_experiment(tmp_path, mode):
  """`--list --experiment=nosuch` printed the whole list with status 0, the
  name ignored; `--report` likewise."""
  res = run(['experiments.reproduce', mode, '--experiment=nosuch',
             f'--root_output_dir={tmp_path}/out'], timeout=60)
  assert_one_error_line(res, "error: --experiment: unknown experiment 'nosuch'")
  assert res.stdout == '' and not (tmp_path / 'out').exists()


def test_reproduce_list_with_an_experiment_shows_that_experiment():
  res = run(['experiments.reproduce', '--list', '--experiment=nastya_mushrooms_fig2'],
            timeout=60)
  assert res.returncode == 0, res.stderr[-2000:]
  lines = res.stdout.splitlines()
  assert len(lines) == 1 and lines[0].startswith('nastya_mushrooms_fig2 '), lines


def test_number_list_parses_and_names_each_bad_item():
  """The shared parser itself: values as numbers, and every way an item can be
  wrong named with the flag and the item."""
  from experiments.configs import ListFlagError, number_list
  assert number_list('etas', ['0.1', '1e-2'], bound='> 0', example='0.1') == [0.1, 0.01]
  assert number_list('run_seeds', ['0', '3'], integer=True, bound='>= 0',
                     example='0,1') == [0, 3]
  assert number_list('eta_multipliers', [], example='1', nonempty=False) == []
  for items, kwargs, message in [
      (['x'], {}, "--f: 'x' is not a number (a comma-separated list of numbers, e.g. 1,2)"),
      (['1.5'], dict(integer=True), "--f: '1.5' is not an integer"),
      (['inf'], {}, "--f: 'inf' is not a finite number"),
      (['0'], dict(bound='> 0'), "--f: '0' is not > 0"),
      (['-1'], dict(bound='>= 0'), "--f: '-1' is not >= 0"),
      (['1.5'], dict(bound='in (0, 1]'), "--f: '1.5' is not in (0, 1]"),
      ([], {}, '--f is empty; give a comma-separated list of numbers'),
  ]:
    with pytest.raises(ListFlagError) as raised:
      number_list('f', items, example='1,2', **kwargs)
    assert str(raised.value).startswith(message), raised.value
    assert isinstance(raised.value, ValueError)  # the binaries' checks catch that
