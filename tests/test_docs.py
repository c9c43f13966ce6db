"""The documentation cannot rot unseen: its links and anchors resolve, every
flag it names exists, the flag reference is what the binaries define, the
training page's algorithm tables are the registry's, the tutorial's code
runs, and nothing speaks of the project's history."""

import glob
import os
import re
import subprocess
import sys

import pytest

from paths import ROOT

PAGES = [os.path.join(ROOT, 'README.md')] + sorted(
    glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'), recursive=True))
# Flags of tools other than the project's binaries that the pages name.
OTHER_TOOLS = {'frozen',                                    # uv run --frozen
               'help', 'helpfull',                          # absl
               'stat',                                      # git show --stat
               'write',                       # python tests/experiments/test_config_pins.py
               'sf'}                                        # LEAF's preprocess.sh


def _text(path: str) -> str:
  with open(path, encoding='utf-8') as f:
    return f.read()


def _prose(text: str) -> str:
  """The page without its fenced code blocks' contents (links live in prose)."""
  return re.sub(r'```.*?```', '', text, flags=re.S)


def slug(heading: str) -> str:
  """GitHub's anchor of a heading."""
  text = re.sub(r'[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}', '', heading.strip().lower())
  text = re.sub(r'[^\w\- ]', '', text)
  return text.replace(' ', '-')


def anchors(path: str) -> set[str]:
  found, seen = set(), {}
  for line in _prose(_text(path)).splitlines():
    m = re.match(r'#{1,6}\s+(.*)', line)
    if m:
      base = slug(m.group(1))
      n = seen.get(base, 0)
      found.add(base if n == 0 else f'{base}-{n}')
      seen[base] = n + 1
  return found


def broken_links(path: str) -> list[str]:
  """'target' of every relative link in `path` whose file or #anchor is missing."""
  bad = []
  for target in re.findall(r'\]\(([^)\s]+)\)', _prose(_text(path))):
    if re.match(r'[a-z]+:', target):  # http:, https:, mailto:
      continue
    file, _, anchor = target.partition('#')
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
    if not os.path.exists(resolved):
      bad.append(target)
    elif anchor and resolved.endswith('.md') and anchor not in anchors(resolved):
      bad.append(target)
  return bad


@pytest.mark.parametrize('page', PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_relative_link_and_anchor_resolves(page):
  assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
  page = tmp_path / 'page.md'
  page.write_text('# A title\n[ok](#a-title) [gone](missing.md) [bad](#no-such-heading)\n')
  assert broken_links(str(page)) == ['missing.md', '#no-such-heading']


@pytest.fixture(scope='module')
def defined_flags() -> set[str]:
  from experiments.lib import flag_reference
  from tff_algos.runtime import worker  # its flags are argparse's
  worker_flags = {a.dest for a in worker.build_parser()._actions}  # pylint: disable=protected-access
  return flag_reference.defined_flags() | worker_flags | OTHER_TOOLS


def unknown_flags(text: str, defined: set[str]) -> list[str]:
  unknown = []
  for name in re.findall(r'(?<![\w-])--([a-z][a-z0-9_]*)', text):
    bool_negation = name.startswith('no') and name[2:] in defined
    if name not in defined and not bool_negation:
      unknown.append(name)
  return sorted(set(unknown))


@pytest.mark.parametrize('page', PAGES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_flag_named_exists(page, defined_flags):
  assert unknown_flags(_text(page), defined_flags) == []


def test_an_unknown_flag_is_found(defined_flags):
  assert unknown_flags('run with --total_rounds=3 --noprogress --no_such_flag',
                       defined_flags) == ['no_such_flag']


def test_the_flag_reference_is_what_the_binaries_define():
  from experiments.lib import flag_reference
  expected = flag_reference.reference()
  assert _text(os.path.join(ROOT, 'docs', 'flags.md')) == expected, (
      'docs/flags.md is stale: python -m experiments.lib.flag_reference > docs/flags.md')


def code_blocks(path: str) -> str:
  """The page's ```python blocks, in order, as one program."""
  return '\n'.join(re.findall(r'```python\n(.*?)```', _text(path), flags=re.S))


def run_program(code: str, cwd) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-c', code], cwd=cwd, capture_output=True, text=True,
                        timeout=600, env=dict(os.environ, PYTHONPATH=ROOT,
                                              TF_CPP_MIN_LOG_LEVEL='2'))


def _table_rows(text: str, first_cell: str) -> list[tuple[str, str]]:
  """(first cell, second cell) of the markdown table rows whose first cell
  matches `first_cell` (a regular expression)."""
  return re.findall(r'^\| (%s) \| (.*?) \|' % first_cell, text, re.M)


def algorithm_table_names(text: str) -> list[str]:
  """The algorithms named in the first column of training.md's algorithm table."""
  section = text.split('\n## Algorithms\n', 1)[1].split('\n## ', 1)[0]
  return [n for cell, _ in _table_rows(section, '`[a-z_]+`(?:, `[a-z_]+`)*')
          for n in re.findall(r'`([a-z_]+)`', cell)]


def read_by_rows(text: str) -> dict[str, set[str]]:
  """training.md's 'flag | read by' table: flag -> the algorithms it names."""
  section = text.split('| flag | read by |', 1)[1].split('\n\n', 1)[0]
  return {flag.strip('`-'): set(names.split(', '))
          for flag, names in _table_rows(section, '`--[a-z_]+`')}


def test_the_algorithm_tables_of_training_md_are_the_registrys():
  """Written by hand, they missed an algorithm once (FedExP) without a word."""
  from tff_algos.algorithms import registry
  from tff_algos.flags import algorithm_flags
  text = _text(os.path.join(ROOT, 'docs', 'training.md'))
  assert sorted(algorithm_table_names(text)) == sorted(registry.ALGORITHMS)
  rows = read_by_rows(text)
  assert rows and {f: set(algorithm_flags.readers(f)) for f in rows} == rows


def test_a_missing_algorithm_fails_the_table_check():
  text = _text(os.path.join(ROOT, 'docs', 'training.md'))
  assert 'fedexp' in algorithm_table_names(text)
  assert 'fedexp' not in algorithm_table_names(re.sub(r'^\| `fedexp` \|.*\n', '', text,
                                                      flags=re.M))
  rows = read_by_rows(text.replace('fedavg, feddyn, fedexp, ', 'fedavg, feddyn, ', 1))
  assert 'fedexp' not in rows['local_steps']


def test_reproducing_md_lists_every_experiment_as_reproduce_does():
  """Its table is `reproduce --list --markdown`, and its counts are the configs'."""
  from experiments import configs
  from experiments.configs import base
  from experiments.lib import reproduce_results
  experiments = configs.all_experiments()
  text = _text(os.path.join(ROOT, 'docs', 'reproducing.md'))
  assert '\n'.join(reproduce_results.markdown_lines(experiments)) in text
  assert f'There are {len(experiments)} experiments' in text
  assert f'({len(experiments)} experiments)' in _text(os.path.join(ROOT, 'README.md'))
  smoke = [e.runner.smoke_task for e in experiments.values()
           if isinstance(e.runner, base.TrainerRuns)]
  assert (f'`digits` for {smoke.count("digits")} experiments, `feddyn_digits` for\n  the '
          f'{smoke.count("feddyn_digits")} paper-003 trainer experiments') in text


def test_the_tutorial_runs(tmp_path):
  code = code_blocks(os.path.join(ROOT, 'docs', 'tutorial.md'))
  assert 'run_training' in code and 'build_fedavg' in code
  res = run_program(code, tmp_path)
  assert res.returncode == 0, res.stderr[-3000:]
  assert 'sparse_categorical_accuracy' in res.stdout


def test_a_broken_snippet_fails(tmp_path):
  res = run_program(code_blocks(os.path.join(ROOT, 'docs', 'tutorial.md')).replace(
      'build_fedavg', 'build_fedavgg', 1), tmp_path)
  assert res.returncode != 0 and 'build_fedavgg' in res.stderr


_HISTORY = re.compile(r'\b[Ss]ession \d+|\bsession-\d+|\(entry \d+\)|\bwork[- ]log\b')


def test_nothing_speaks_of_the_projects_history():
  """No numbered reference to the project's history in the product."""
  files = PAGES + [p for top in ('tff_algos', 'tasks', 'experiments', 'tests')
                   for p in glob.glob(os.path.join(ROOT, top, '**', '*.py'), recursive=True)]
  found = [f'{os.path.relpath(p, ROOT)}: {m.group(0)}' for p in files
           if p != os.path.abspath(__file__) for m in [_HISTORY.search(_text(p))] if m]
  assert found == []
