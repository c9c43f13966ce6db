"""Every setting of every reproduction config, pinned.

`tests/data/full_commands.txt` holds what `reproduce --print_commands
--scale=full` gives for every experiment (the trainer commands, or a binary's
command line) and the defaults of the flags each experiment binary defines
(what a binary's command leaves unset runs at them). A change to any of them
fails here, so that no edit moves a config away from its paper unnoticed; the
other tests check the values against the papers. After a deliberate change,
regenerate the file and review its diff:

    python tests/experiments/test_config_pins.py --write
"""

import json
import os
import subprocess
import sys

if __name__ == '__main__':  # run as a script: the tests' helpers are one folder up
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from paths import ROOT  # noqa: E402

PINS = os.path.join(ROOT, 'tests', 'data', 'full_commands.txt')

# Prints the defaults of the flags a module defines, as JSON (one process per
# binary: two binaries may define flags of the same name).
_DEFAULTS = """
import json, sys
from absl import flags
import importlib
module = sys.argv[1]
importlib.import_module(module)
print(json.dumps({f.name: repr(f.default)
                  for f in flags.FLAGS.get_flags_for_module(module)}, sort_keys=True))
"""


def current_pins() -> list[str]:
  """The lines of the pin file as the configs and binaries give them now."""
  sys.path.insert(0, ROOT)
  from experiments import configs, reproduce  # pylint: disable=g-import-not-at-top
  from experiments.lib import plans  # pylint: disable=g-import-not-at-top
  from experiments.configs import base  # pylint: disable=g-import-not-at-top
  lines, binaries = [], set()
  for name, exp in configs.all_experiments().items():
    lines.append(f'# {name}')
    if isinstance(exp.runner, base.TrainerRuns):
      lines += [p.command('out') for p in reproduce.trainer_plans(exp, 'full')]
    else:
      # The config's own flags (`binary_argv` adds the runtime's, e.g. --backend).
      lines.append(' '.join([f'python -m {exp.runner.module}'] + [
          f'--{k}={plans.flag_str(v)}' for k, v in exp.runner.flags.items()]))
      binaries.add(exp.runner.module)
  env = dict(os.environ, PYTHONPATH=ROOT)
  procs = {m: subprocess.Popen([sys.executable, '-c', _DEFAULTS, m], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for m in sorted(binaries)}
  for module, proc in procs.items():
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    defaults = json.loads(out.strip().splitlines()[-1])
    lines.append(f'# defaults of {module}')
    lines += [f'--{k}={v}' for k, v in defaults.items()]
  return lines


def test_every_config_setting_is_pinned():
  with open(PINS) as f:
    pinned = f.read().splitlines()
  now = current_pins()
  changed = [f'- {l}' for l in pinned if l not in set(now)] + [
      f'+ {l}' for l in now if l not in set(pinned)]
  assert now == pinned, (
      'a reproduction setting changed (- pinned, + now); if deliberate, run '
      '`python tests/experiments/test_config_pins.py --write` and review the diff:\n' +
      '\n'.join(changed[:40]))


if __name__ == '__main__':
  if sys.argv[1:] != ['--write']:
    sys.exit('usage: python tests/experiments/test_config_pins.py --write')
  pins = current_pins()  # before the file is opened: a failure leaves it as it was
  with open(PINS, 'w') as f:
    f.write('\n'.join(pins) + '\n')
  print(f'wrote {PINS}')
