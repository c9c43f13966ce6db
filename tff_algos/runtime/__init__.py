"""Execution contexts and their lifecycle."""

from tff_algos.runtime.context import ManagedContext, install, managed_context, shutdown
