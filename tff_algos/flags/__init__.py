"""The flag-aware layer: absl flags derived from the configs' declarations
(`declared`), and the algorithm flags as the binaries see them (`algorithm_flags`:
which algorithms read each, the refusals, each algorithm's own defaults). It
alone turns field names into flag names; it imports no TensorFlow."""
