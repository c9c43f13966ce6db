"""Start-up shared by the experiment binaries."""

from absl import logging


def quiet_logs():
  """Keeps absl/TF INFO chatter (checkpoint writes, font caches) off the console."""
  import tensorflow as tf
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
  import logging as py_logging
  py_logging.getLogger('matplotlib').setLevel(py_logging.WARNING)
