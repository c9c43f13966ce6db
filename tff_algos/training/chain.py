"""Several rounds of a learning process in one TFF call.

On a small model a round's cost is mostly fixed per call: TFF's invocation,
the argument and result conversion and, on the in-process backend, one call
of the traced round (`docs/performance.md`). `chained_next(process, n)` is n
rounds of `process.next` composed in one federated computation,

    (state, [data_1, ..., data_n]) -> (state_n, [metrics_1, ..., metrics_n]),

so those costs are paid once per n rounds. It runs the same computations in
the same order as n calls of `process.next`, so its state and metrics equal
theirs bit for bit (`tests/test_chain.py`); only the boundaries between calls
go. The trainer uses it between the rounds at which something must leave the
computation (an evaluation, a checkpoint, the last round); a run with a round
callback, which sees every round's state, runs one round per call.

Only processes whose `next` takes (server state, client data) and returns
(state, metrics) can be chained (`can_chain`); one whose clients keep states
(FedDyn, SCAFFOLD) takes and returns them too, and its store is read and
written between rounds. Several workers (`--workers`) run one round per call
(`context_runs_chains`).
"""

from __future__ import annotations

import weakref

import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
from tensorflow_federated.python.core.impl.execution_contexts import (
    mergeable_comp_execution_context)

# process -> {n: its n-round computation}; built once per process and n.
_CHAINS: 'weakref.WeakKeyDictionary' = weakref.WeakKeyDictionary()


def can_chain(process) -> bool:
  """Whether `process.next` is (state@SERVER, data@CLIENTS) -> (state, metrics)."""
  next_fn = getattr(process, 'next', None)
  signature = getattr(next_fn, 'type_signature', None)
  if not isinstance(signature, tff.FunctionType):
    return False
  parameter, result = signature.parameter, signature.result
  if not isinstance(parameter, tff.StructType) or len(parameter) != 2:
    return False
  state_type, data_type = parameter
  return (isinstance(data_type, tff.FederatedType) and data_type.placement == tff.CLIENTS
          and isinstance(result, tff.StructType) and len(result) == 2
          and result[0].is_equivalent_to(state_type))


def context_runs_chains() -> bool:
  """False under TFF's multi-worker context (`--workers`): it splits each
  call's clients across workers and merges their partial aggregates, which
  allows one aggregation per call, not a chain of rounds."""
  return not isinstance(context_stack_impl.context_stack.current,
                        mergeable_comp_execution_context.MergeableCompExecutionContext)


def chained_next(process, n: int) -> tff.Computation:
  """n rounds of `process.next` as one computation (see the module docstring)."""
  if n < 1:
    raise ValueError(f'a chain needs at least 1 round, got {n}')
  if not can_chain(process):
    raise ValueError('only a process whose next takes (state, client data) and returns '
                     '(state, metrics) can run several rounds per call')
  chains = _CHAINS.setdefault(process, {})
  chain = chains.get(n)
  if chain is None:
    # The chain holds `next`, not the process, so a process no longer used
    # elsewhere drops out of `_CHAINS` with its chains.
    next_fn = process.next
    state_type, data_type = next_fn.type_signature.parameter

    @tff.federated_computation(state_type, tff.StructType([data_type] * n))
    def chain(state, data):
      metrics = []
      for i in range(n):
        output = next_fn(state, data[i])
        state = output[0]
        metrics.append(output[1])
      return state, metrics

    chains[n] = chain
  return chain
