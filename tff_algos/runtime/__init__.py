"""Execution contexts and their lifecycle.

The backend checks (`backend_options`) import no TensorFlow, so flag
validation can use them before TensorFlow loads; the context names load
`context` (and TensorFlow) on first use.
"""

from tff_algos.runtime.backend_options import BACKENDS, check_backend, parse_workers

_CONTEXT_NAMES = ('ManagedContext', 'WorkerStopped', 'active', 'install', 'managed_context',
                  'raise_if_interrupted', 'shutdown')


def __getattr__(name):
  if name in _CONTEXT_NAMES:
    from tff_algos.runtime import context  # pylint: disable=g-import-not-at-top
    return getattr(context, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
