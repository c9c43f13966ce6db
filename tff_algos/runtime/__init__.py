"""Execution contexts and their lifecycle."""

from tff_algos.runtime.backend_options import BACKENDS, check_backend, parse_workers
from tff_algos.runtime.context import (ManagedContext, WorkerStopped, active, install,
                                      managed_context, raise_if_interrupted, shutdown)
