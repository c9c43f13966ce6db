"""Running a binary as `python -m experiments.<name>` does, in a test's own
directory, and checking that it refused its command line with one `error:`
line before TensorFlow loaded (said without timing it: on the way out the
process prints 'TF loaded: <bool>')."""

import os
import subprocess
import sys

from paths import ROOT


def run_binary(binary, *argv, cwd, setup='', timeout=120, as_main=False):
  """`python -m experiments.<binary> argv...` as the binaries run it
  (`common.run(main)`; `as_main`: the module run as __main__, so that what its
  `if __name__ == '__main__':` block sets, e.g. feddyn's defaults, applies),
  in `cwd` (a test's own directory: a binary that is not refused writes its
  default output directory there, not in the repository), with 'TF loaded:
  <bool>' printed on stdout on the way out, so that a test can say the answer
  came before TensorFlow was imported (a time limit would be flaky on a loaded
  machine). `setup`: code run first."""
  if as_main:
    load, run = 'import runpy\n', f'runpy.run_module("experiments.{binary}", run_name="__main__")'
  else:
    load, run = (f'from experiments.lib import common\nfrom experiments import {binary} as binary\n',
                 'common.run(binary.main)')
  code = (f'import sys; sys.argv = {[binary, *argv]!r}\n{setup}\n{load}'
          f'try:\n  {run}\n'
          'finally:\n  print("TF loaded:", "tensorflow" in sys.modules)\n')
  return subprocess.run([sys.executable, '-c', code], cwd=cwd, capture_output=True,
                        text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT))


def assert_refused(res, *fragments, before_tensorflow=True):
  """Exit 2; stderr's last line, its only 'error:' line, holds `fragments`;
  no traceback; TensorFlow not imported (unless `before_tensorflow` is False).
  Returns that line."""
  out = res.stdout + res.stderr
  assert res.returncode == 2, out[-3000:]
  assert 'Traceback' not in out, out[-3000:]
  lines = res.stderr.strip().splitlines()
  assert lines and lines[-1].startswith('error:'), res.stderr[-3000:]
  assert [l for l in lines if l.startswith('error:')] == lines[-1:], res.stderr[-3000:]
  for fragment in fragments:
    assert fragment in lines[-1], lines[-1]
  if before_tensorflow:
    assert 'TF loaded: False' in res.stdout, out[-3000:]
  return lines[-1]
