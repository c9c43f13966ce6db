"""Evaluates a compiled (call-dominant) building block, as TFF's C++ worker does.

Intrinsics are interpreted as in TFF's C++ `FederatingExecutor`; in particular
`federated_aggregate` folds `accumulate` over the clients in order, then
applies `report` (no `merge`). Supported: the intrinsics the native compiler
leaves in our learning processes (map, apply, broadcast, zip, aggregate, value,
eval) and sum/mean/weighted mean; others raise a clear `ValueError`.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Callable, Optional

import tensorflow as tf
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.compiler import building_blocks as bb
from tensorflow_federated.python.core.impl.types import placements

from tff_algos.runtime.inprocess import graph_surgery
from tff_algos.runtime.inprocess import tensorflow_function
from tff_algos.runtime.inprocess.tensorflow_function import TensorFlowFunction
from tff_algos.runtime.inprocess.values import Federated, federated_parts

CLIENTS, SERVER = placements.CLIENTS, placements.SERVER

UNSUPPORTED_INTRINSICS = (
    'federated_secure_sum', 'federated_secure_sum_bitwidth', 'federated_secure_modular_sum',
    'federated_select', 'federated_secure_select', 'federated_min', 'federated_max',
    'sequence_map', 'sequence_reduce', 'sequence_sum')


class Environment:
  """Names bound by blocks and lambdas, looked up innermost first."""
  __slots__ = ('names', 'parent')

  def __init__(self, names: dict, parent: Optional['Environment']):
    self.names, self.parent = names, parent

  def lookup(self, name):
    env = self
    while env is not None:
      if name in env.names:
        return env.names[name]
      env = env.parent
    raise ValueError(f'Unbound reference {name!r}')


def _map_structure(fn, *xs):
  if isinstance(xs[0], structure.Struct):
    return structure.map_structure(fn, *xs)
  return fn(*xs)


def _add(a, b):
  return _map_structure(tf.add, a, b)


def _lane_slots(devices: list[str], lanes: int) -> tuple:
  """(device, import) slots: `lanes` per device; () for one lane on the default device.

  One import per slot: slots on different devices must not share variables.
  """
  devs = devices if len(devices) > 1 else [None]
  slots = tuple((d, j * len(devs) + i) for j in range(lanes) for i, d in enumerate(devs))
  return () if slots == (tensorflow_function.NO_SLOT,) else slots


class Interpreter:
  """Evaluates a compiled building block for a given number of clients."""

  def __init__(self, num_clients: int, devices: list[str], tf_functions: dict,
               host_datasets: bool = False, lanes: int = 1,
               on_new_function: Optional[Callable[[TensorFlowFunction], None]] = None):
    self.num_clients = num_clients
    self.devices = devices
    self.host_datasets = host_datasets
    # Client k's TensorFlow work (a federated_map of a TensorFlow computation)
    # goes to slot k mod #slots: devices[k mod #devices] when several, and on
    # each device `lanes` imports that run concurrently. Only client training
    # (computations that take datasets) gets lanes: other per-client maps are small.
    self._training_slots, self._client_slots = _lane_slots(devices, lanes), _lane_slots(
        devices, 1)
    self.tf_functions = tf_functions  # id(CompiledComputation) -> (it, function)
    self._on_new_function = on_new_function

  def tensorflow(self, comp: bb.CompiledComputation) -> TensorFlowFunction:
    """The computation imported (once per computation)."""
    key = id(comp)
    entry = self.tf_functions.get(key)
    if entry is None or entry[0] is not comp:
      # Equal computations (e.g. each round's copy in a computation that runs
      # several rounds) share one import: one set of functions to instantiate.
      content = ('proto', hashlib.sha256(
          comp.proto.SerializeToString(deterministic=True)).digest())  # not MBs of graph
      entry = self.tf_functions.get(content)
      if entry is not None:
        entry = (comp, entry[1])
        self.tf_functions[key] = entry
        return entry[1]
      with tf.init_scope():  # imported eagerly, also when met while tracing
        if self.host_datasets and tensorflow_function.takes_datasets(comp.type_signature):
          entry = (comp, TensorFlowFunction(graph_surgery.inline_function_calls(comp).proto,
                                            comp.type_signature, host_datasets=True))
        else:
          entry = (comp, TensorFlowFunction(comp.proto, comp.type_signature))
      self.tf_functions[key] = self.tf_functions[content] = entry
      if self._on_new_function is not None:
        self._on_new_function(entry[1])
    return entry[1]

  def eval(self, comp, env: Optional[Environment]):
    if isinstance(comp, bb.Reference):
      return env.lookup(comp.name)
    if isinstance(comp, bb.Call):
      fn = self.eval(comp.function, env)
      return fn() if comp.argument is None else fn(self.eval(comp.argument, env))
    if isinstance(comp, bb.Selection):
      source = self.eval(comp.source, env)
      return source[comp.as_index()]
    if isinstance(comp, bb.Struct):
      return structure.Struct([(name, self.eval(e, env))
                               for name, e in structure.iter_elements(comp)])
    if isinstance(comp, bb.Block):
      scope = Environment({}, env)
      for name, value in comp.locals:
        scope.names[name] = self.eval(value, scope)
      return self.eval(comp.result, scope)
    if isinstance(comp, bb.Lambda):
      name, body = comp.parameter_name, comp.result
      if name is None:
        return lambda: self.eval(body, env)
      return lambda arg: self.eval(body, Environment({name: arg}, env))
    if isinstance(comp, bb.CompiledComputation):
      if comp.proto.WhichOneof('computation') != 'tensorflow':
        raise ValueError(f'In-process backend: unsupported compiled computation '
                         f'{comp.proto.WhichOneof("computation")!r}.')
      return self.tensorflow(comp)
    if isinstance(comp, bb.Intrinsic):
      return self.intrinsic(comp.uri)
    if isinstance(comp, bb.Literal):
      return tf.constant(comp.value, dtype=comp.type_signature.dtype)
    raise ValueError(f'In-process backend: unsupported building block '
                     f'{type(comp).__name__}: {comp.compact_representation()[:200]}')

  def intrinsic(self, uri: str) -> Callable:
    """The intrinsic as a function of its argument; ValueError if unsupported."""
    method = _INTRINSICS.get(uri)
    if method is not None:
      return functools.partial(method, self)
    if uri in UNSUPPORTED_INTRINSICS:
      raise ValueError(f'In-process backend: intrinsic {uri!r} is not supported; '
                       'use --backend=cpp.')
    raise ValueError(f'In-process backend: unknown intrinsic {uri!r}; use --backend=cpp.')

  def _on_client(self, k: int, fn: Callable, *args):
    if len(self.devices) > 1:
      with tf.device(self.devices[k % len(self.devices)]):
        return fn(*args)
    return fn(*args)

  # -- intrinsics (see `_INTRINSICS`)

  def federated_map(self, arg, keep_all_equal: bool = False):
    fn, x = arg[0], arg[1]
    if x.placement is SERVER:
      return Federated(SERVER, fn(x.value), True)
    if keep_all_equal and x.all_equal:
      return Federated(CLIENTS, fn(x.value), True)
    members = x.members(self.num_clients)
    if isinstance(fn, TensorFlowFunction):
      slots = (self._training_slots if fn.takes_datasets and not fn.seeded_random
               else self._client_slots)
      return Federated(CLIENTS, fn.map(members, slots), False)
    return Federated(CLIENTS, [self._on_client(k, fn, v) for k, v in enumerate(members)],
                     False)

  def federated_broadcast(self, x):
    return Federated(CLIENTS, x.value, True)

  def federated_value(self, v, placement):
    return Federated(placement, v, True)

  def federated_eval_at_server(self, fn):
    return Federated(SERVER, fn(), True)

  def federated_eval_at_clients(self, fn):
    return Federated(CLIENTS, [self._on_client(k, fn) for k in range(self.num_clients)], False)

  def federated_zip(self, x, placement):
    n = self.num_clients

    def member(x, k):
      if isinstance(x, Federated):
        return x.value if (x.all_equal or placement is SERVER) else x.value[k]
      return structure.Struct([(name, member(e, k)) for name, e in structure.iter_elements(x)])

    if placement is SERVER or all(f.all_equal for f in federated_parts(x)):
      return Federated(placement, member(x, 0), True)
    return Federated(placement, [member(x, k) for k in range(n)], False)

  def federated_aggregate(self, arg):
    x, zero, accumulate, report = arg[0], arg[1], arg[2], arg[4]
    if isinstance(accumulate, TensorFlowFunction):
      acc = accumulate.fold(zero, x.members(self.num_clients))
    else:
      acc = zero
      for v in x.members(self.num_clients):
        acc = accumulate(structure.Struct([(None, acc), (None, v)]))
    return Federated(SERVER, report(acc), True)

  def federated_sum(self, x):
    members = x.members(self.num_clients)
    if not members:
      raise ValueError('In-process backend: federated_sum over zero clients.')
    total = members[0]
    for v in members[1:]:
      total = _add(total, v)
    return Federated(SERVER, total, True)

  def federated_mean(self, x):
    return self._weighted_mean(x.members(self.num_clients), [1.0] * self.num_clients)

  def federated_weighted_mean(self, arg):
    return self._weighted_mean(arg[0].members(self.num_clients),
                               arg[1].members(self.num_clients))

  def _weighted_mean(self, values: list, weights: list):
    total_weight = sum(tf.cast(w, tf.float64) for w in weights)
    total = None
    for v, w in zip(values, weights):
      term = _map_structure(lambda t, w=w: t * tf.cast(w, t.dtype), v)
      total = term if total is None else _add(total, term)
    return Federated(SERVER, _map_structure(
        lambda t: t / tf.cast(total_weight, t.dtype), total), True)


# Intrinsic URI -> the method interpreting it, a function of (interpreter, argument).
_INTRINSICS = {
    'federated_map': Interpreter.federated_map,
    'federated_apply': Interpreter.federated_map,
    'federated_map_all_equal': functools.partial(Interpreter.federated_map,
                                                 keep_all_equal=True),
    'federated_broadcast': Interpreter.federated_broadcast,
    'federated_value_at_server': functools.partial(Interpreter.federated_value,
                                                   placement=SERVER),
    'federated_value_at_clients': functools.partial(Interpreter.federated_value,
                                                    placement=CLIENTS),
    'federated_eval_at_server': Interpreter.federated_eval_at_server,
    'federated_eval_at_clients': Interpreter.federated_eval_at_clients,
    'federated_zip_at_clients': functools.partial(Interpreter.federated_zip, placement=CLIENTS),
    'federated_zip_at_server': functools.partial(Interpreter.federated_zip, placement=SERVER),
    'federated_aggregate': Interpreter.federated_aggregate,
    'federated_sum': Interpreter.federated_sum,
    'federated_mean': Interpreter.federated_mean,
    'federated_weighted_mean': Interpreter.federated_weighted_mean,
}
