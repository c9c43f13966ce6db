"""The flag-aware layer: every algorithm flag's name, default and help, and the
flag combinations each algorithm refuses (no TensorFlow)."""
