"""absl experiment binaries (`python -m experiments.<name>`)."""

import os

# Quiet TensorFlow's C++ start-up chatter unless the user asked for it.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
