"""absl experiment binaries (`python -m experiments.<name>`)."""

import os

# Quiet TensorFlow's C++ start-up chatter unless the user asked for it.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# Import TensorFlow before absl's app.run starts: when TF is first imported
# inside app.run, building TFF's Keras baseline models later fails with
# "IndexError: list index out of range" in Sequential.add (seen with TF 2.14 /
# TFF 0.87's EMNIST cnn_dropout model).
import tensorflow  # noqa: E402,F401  pylint: disable=unused-import,g-import-not-at-top
