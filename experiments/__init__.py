"""absl experiment binaries (`python -m experiments.<name>`)."""

import os

# Quiet TensorFlow's C++ start-up chatter unless the user asked for it.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# TensorFlow is imported by each binary's main, after its flags are checked
# (`common.run`), so that a bad flag is answered at once. TensorFlow imported
# after absl's app.run has started would otherwise build Keras models in graph
# mode (TF 2.14: "IndexError: list index out of range" in Sequential.add);
# TF2_BEHAVIOR makes it start in TF2 (eager) mode whenever it is imported.
os.environ.setdefault('TF2_BEHAVIOR', '1')
