"""absl experiment binaries (`python -m experiments.<name>`; `python -m experiments`
lists them). Their shared plumbing is `experiments.lib`, the paper experiments
`experiments.configs`."""

from tff_algos.runtime import quiet_tensorflow

quiet_tensorflow.install()
