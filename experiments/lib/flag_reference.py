"""docs/flags.md: every binary's flags, from the binaries' own definitions.

    python -m experiments.lib.flag_reference > docs/flags.md

Each binary is imported in a process of its own (two binaries may define
flags of the same name), its flags read from absl with the module that
defines them; flags that several binaries share (the trainer's, the
backend's) are listed once. `tests/test_docs.py` fails when docs/flags.md is
not what this prints. No TensorFlow is imported.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Imports a binary and prints {module: [flag, ...]} for the project's flag modules.
_DUMP = '''
import importlib, json, sys
from absl import flags
module = importlib.import_module(sys.argv[1])
if callable(getattr(module, 'define_flags', None)):  # flags defined only when run as a program
  module.define_flags()
out = {}
for module, defined in flags.FLAGS.flags_by_module_dict().items():
  if module.split('.')[0] in ('experiments', 'tff_algos', 'tasks'):
    out[module] = [dict(name=f.name, default=f.default, help=f.help) for f in defined]
print(json.dumps(out, default=repr))
'''

# The shared flag modules, with a title each, in this order.
SHARED = {'experiments.lib.flags': 'Trainer flags',
          'experiments.lib.runtime_flags': 'Backend flags'}
# The trainer's flags, grouped by what declares them.
_TRAINER_GROUPS = ('Task and data (`tasks.TaskOptions`)',
                   'Algorithm (the configs of `tff_algos/algorithms/`)',
                   'Round loop and outputs (`tff_algos.training.RunConfig`)')


def binaries() -> list[tuple[str, str]]:
  """(name, first docstring line) of every binary, as `python -m experiments` lists them."""
  sys.path.insert(0, ROOT)
  import ast  # pylint: disable=g-import-not-at-top
  here = os.path.join(ROOT, 'experiments')
  found = []
  for file in sorted(os.listdir(here)):
    if not file.endswith('.py') or file.startswith('_'):
      continue
    source = open(os.path.join(here, file)).read()
    if "if __name__ == '__main__':" in source:
      doc = ast.get_docstring(ast.parse(source)) or ''
      found.append((file[:-3], doc.splitlines()[0] if doc else ''))
  return found


@functools.lru_cache(maxsize=None)  # the reference and the flag check read the same dumps
def _dump(module: str) -> dict:
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='2')
  res = subprocess.run([sys.executable, '-c', _DUMP, module], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=env, check=True)
  return json.loads(res.stdout.strip().splitlines()[-1])


def _cell(text) -> str:
  return ' '.join(str(text).split()).replace('|', '\\|')


def _default(flag: dict) -> str:
  value = flag['default']
  if value is None or value == []:
    return 'unset'
  if isinstance(value, list):
    return f'`{",".join(map(str, value))}`'
  return f'`{value}`'


def _table(flags_: list[dict]) -> list[str]:
  rows = ['| flag | default | meaning |', '|---|---|---|']
  for f in sorted(flags_, key=lambda f: f['name']):  # an enum's help starts <a|b|c>:
    rows.append(f'| `--{f["name"]}` | {_default(f)} | {_cell(f["help"])} |')
  return rows


def _trainer_groups(flags_: list[dict]) -> dict[str, list[dict]]:
  """The trainer's flags by what declares them (the rest: the trainer's own)."""
  sys.path.insert(0, ROOT)
  from tasks import TaskOptions  # pylint: disable=g-import-not-at-top
  from tff_algos.core import hparams  # pylint: disable=g-import-not-at-top
  from tff_algos.flags import algorithm_flags  # pylint: disable=g-import-not-at-top
  from tff_algos.training.config import RunConfig  # pylint: disable=g-import-not-at-top
  run = {d.flag for d in hparams.declarations(RunConfig).values()}
  task = {d.flag for d in hparams.declarations(TaskOptions).values()} - run
  algorithm = set(algorithm_flags.SPECS) | {'algorithm'}
  groups = {title: [] for title in _TRAINER_GROUPS}
  groups['Outputs'] = []
  for f in flags_:
    name = f['name']
    title = (_TRAINER_GROUPS[0] if name in task or name == 'task' else
             _TRAINER_GROUPS[1] if name in algorithm else
             _TRAINER_GROUPS[2] if name in run else 'Outputs')
    groups[title].append(f)
  return {t: g for t, g in groups.items() if g}


def defined_flags() -> set[str]:
  """The name of every flag of every binary (each imported in its own process)."""
  return {f['name'] for name, _ in binaries() for flags_ in _dump(f'experiments.{name}').values()
          for f in flags_}


def reference() -> str:
  """docs/flags.md's text."""
  listed = binaries()
  dumps = {name: _dump(f'experiments.{name}') for name, _ in listed}
  lines = ['# Flags', '',
           'Every flag of every binary (`python -m experiments.<name> --help` says the same), '
           'generated from the binaries\' own definitions by '
           '`python -m experiments.lib.flag_reference > docs/flags.md`; '
           '`tests/test_docs.py` fails when this page is stale. The algorithm flags are the '
           'fields the algorithms\' configs declare (`tff_algos/algorithms/*/config.py`): '
           'where an algorithm\'s own default differs, the meaning says so, e.g. '
           '"(fedgbo, mfl: 10)".', '']
  for module, title in SHARED.items():
    users = [name for name, _ in listed if module in dumps[name]]
    flags_ = next(dumps[name][module] for name in users)
    lines += [f'## {title}', '',
              f'Read by {", ".join(f"`{u}`" for u in users)} (`{module}`).', '']
    if module == 'experiments.lib.flags':
      for group, group_flags in _trainer_groups(flags_).items():
        lines += [f'### {group}', '', *_table(group_flags), '']
    else:
      lines += [*_table(flags_), '']
  lines += ['## Each binary\'s own flags', '']
  for name, doc in listed:
    own = dumps[name].get(f'experiments.{name}', [])
    shared = [SHARED[m] for m in SHARED if m in dumps[name]]
    lines += [f'### {name}', '', f'`python -m experiments.{name}`: {doc}'
              + (f' Also: {", ".join(s.lower() for s in shared)}.' if shared else ''), '']
    lines += [*_table(own), ''] if own else ['No flags of its own.', '']
  return '\n'.join(lines).rstrip('\n') + '\n'


if __name__ == '__main__':
  sys.stdout.write(reference())
