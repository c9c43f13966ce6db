"""Start-up and error reporting shared by the experiment binaries."""

import sys

from absl import logging

USAGE_ERROR = 2  # exit status for bad flags or inputs


def fail(message) -> int:
  """Prints one 'error: ...' line to stderr; returns the usage-error status."""
  print(f'error: {message}', file=sys.stderr)
  return USAGE_ERROR


def quiet_logs():
  """Keeps absl/TF INFO chatter (checkpoint writes, font caches) off the console."""
  import tensorflow as tf
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
  import logging as py_logging
  py_logging.getLogger('matplotlib').setLevel(py_logging.WARNING)
