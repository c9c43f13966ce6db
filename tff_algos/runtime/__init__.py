"""Execution contexts and their lifecycle."""

from tff_algos.runtime.context import (BACKENDS, ManagedContext, WorkerStopped, active,
                                      check_backend, install, managed_context, parse_workers,
                                      raise_if_interrupted, shutdown)
