"""Federated-optimisation algorithms as TFF learning processes.

`algorithms` (one package per algorithm), `core` (the building blocks),
`training` (the round loop), `runtime` (TFF contexts), `flags` (the binaries'
flags, derived from the algorithms' declarations). docs/extending.md draws
the layers.
"""
