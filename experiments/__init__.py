"""absl experiment binaries (`python -m experiments.<name>`)."""

import os
import re
import sys

# Quiet TensorFlow's C++ start-up chatter unless the user asked for it.
_VERBOSE = os.environ.get('TF_CPP_MIN_LOG_LEVEL') == '0'
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# TensorFlow is imported by each binary's main, after its flags are checked
# (`common.run`), so that a bad flag is answered at once. TensorFlow imported
# after absl's app.run has started would otherwise build Keras models in graph
# mode (TF 2.14: "IndexError: list index out of range" in Sequential.add);
# TF2_BEHAVIOR makes it start in TF2 (eager) mode whenever it is imported.
os.environ.setdefault('TF2_BEHAVIOR', '1')

# TensorFlow 2.14 prints three ERROR lines on every import, whatever the
# machine: "Unable to register cuDNN/cuFFT/cuBLAS factory: Attempting to
# register factory for plugin ... when one has already been registered"
# (tensorflow/tensorflow#62075: its CUDA plugins are registered twice). They
# are harmless and say nothing about this machine's GPU, yet they are the first
# thing every binary printed, in each --jobs worker too. TF_CPP_MIN_LOG_LEVEL=3
# would also hide real errors; instead the C++ side's stderr is captured while
# TensorFlow imports, and everything else in it is written back, in order.
# TF_CPP_MIN_LOG_LEVEL=0 keeps them.
_HARMLESS = re.compile(rb'Unable to register cu(DNN|FFT|BLAS) factory: Attempting to '
                       rb'register factory for plugin cu\w+ when one has already been registered')


class _TensorFlowImportFilter:
  """A meta path finder that runs TensorFlow's import with `_HARMLESS` lines
  taken out of stderr (fd 2), once, then leaves `sys.meta_path`."""

  def find_spec(self, name, path=None, target=None):
    del path, target
    if name != 'tensorflow':
      return None
    sys.meta_path.remove(self)
    import importlib.util  # pylint: disable=g-import-not-at-top
    spec = importlib.util.find_spec(name)
    loader = getattr(spec, 'loader', None)
    if loader is not None and hasattr(loader, 'exec_module'):
      execute = loader.exec_module

      def exec_module(module):
        del loader.exec_module  # the loader's own again
        _filtered_stderr(execute, module)

      loader.exec_module = exec_module
    return spec


def _filtered_stderr(fn, *args):
  """fn(*args) with fd 2 captured; its lines but `_HARMLESS` written back."""
  import tempfile  # pylint: disable=g-import-not-at-top
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      return fn(*args)
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      os.write(2, b''.join(line for line in captured.read().splitlines(keepends=True)
                           if not _HARMLESS.search(line)))


if not _VERBOSE and 'tensorflow' not in sys.modules:
  sys.meta_path.insert(0, _TensorFlowImportFilter())
