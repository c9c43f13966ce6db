"""The library as a wheel: `uv build` makes one of `tff_algos` alone, and
installed into another environment it gives every algorithm, the round loop
and the runtime without the checkout on the path."""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

from paths import ROOT

# Run in the other environment, from a directory outside the checkout.
_IMPORTS = '''
import importlib.util, sys
import tff_algos
from tff_algos.algorithms import registry
from tff_algos import runtime, training
for name, algorithm in registry.ALGORITHMS.items():
  assert callable(algorithm.builder_fn()), name   # imports its TFF half
from tff_algos.algorithms import feddyn
assert callable(feddyn.build_feddyn) and feddyn.FedDynConfig().alpha == 0.01
assert callable(training.run_training) and callable(runtime.install)
print(tff_algos.__file__)
print(importlib.util.find_spec('tasks'), importlib.util.find_spec('experiments'))
'''


def test_the_wheel_holds_the_library_and_installs_without_the_checkout(tmp_path):
  uv = os.environ.get('UV') or shutil.which('uv')  # `uv run` says where it is
  assert uv, 'uv builds the wheel: python3 -m pip install uv'
  dist = tmp_path / 'dist'
  res = subprocess.run([uv, 'build', '--wheel', '--out-dir', str(dist), ROOT],
                       capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  (wheel,) = glob.glob(str(dist / 'tff_algos-*.whl'))
  names = zipfile.ZipFile(wheel).namelist()
  assert 'tff_algos/algorithms/feddyn/process.py' in names
  assert all(n.startswith(('tff_algos/', 'tff_algos-')) for n in names), sorted(
      {n.split('/')[0] for n in names})

  # Another environment: the project's dependencies (this environment's
  # packages, through a .pth file) and the wheel; not the checkout.
  env = tmp_path / 'env'
  subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(env)], check=True,
                 timeout=120)
  python = str(env / 'bin' / 'python')
  (site,) = glob.glob(str(env / 'lib' / 'python*' / 'site-packages'))
  with open(os.path.join(site, 'dependencies.pth'), 'w') as f:
    f.write(sysconfig.get_paths()['purelib'] + '\n')
  res = subprocess.run([uv, 'pip', 'install', '--no-deps', '--python', python, wheel],
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  outside = tmp_path / 'elsewhere'
  outside.mkdir()
  environ = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'VIRTUAL_ENV')}
  res = subprocess.run([python, '-c', _IMPORTS], cwd=outside, capture_output=True, text=True,
                       env=dict(environ, TF_CPP_MIN_LOG_LEVEL='2'), timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  location, found = res.stdout.strip().splitlines()[-2:]
  assert location.startswith(site) and not location.startswith(ROOT), location
  assert found == 'None None'   # tasks/ and experiments/ stay in the repository
