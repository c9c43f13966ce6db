"""Federated-optimisation algorithms as TFF learning processes."""
