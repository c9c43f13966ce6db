"""How the interpreter represents TFF values, and conversions to and from Python.

Federated values at CLIENTS are Python lists (one entry per client, in order)
unless all equal, at SERVER single values; structures are `structure.Struct`s,
tensors `tf.Tensor`s, datasets `tf.data.Dataset`s.
"""

from __future__ import annotations

import weakref

import attr
import numpy as np
import tensorflow as tf
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.types import computation_types
from tensorflow_federated.python.core.impl.types import placements


class Federated:
  """A federated value: `value` is a list per client unless `all_equal`."""
  __slots__ = ('placement', 'all_equal', 'value')

  def __init__(self, placement, value, all_equal):
    self.placement, self.value, self.all_equal = placement, value, all_equal

  def members(self, num_clients: int) -> list:
    return [self.value] * num_clients if self.all_equal else self.value


# `structure.Struct`'s fields, as `struct_like` sets them (TFF 0.87).
_STRUCT_SLOTS = ('_hash', '_element_array', '_name_to_index', '_name_array', '_elements_cache')
_FAST_STRUCTS = tuple(structure.Struct.__slots__) == _STRUCT_SLOTS


def struct_like(like: structure.Struct, values) -> structure.Struct:
  """A `structure.Struct` of `values` named as `like` (a Struct or a
  StructType of as many elements).

  `Struct.__init__` checks every element to be a (name, value) pair (an ABC
  `isinstance`) and every name to be new: ~1 us an element, ~64 structures and
  0.3 ms a round of the quadratic toy in `ingest`, `materialise` and the
  tracer's `pack`/`unpack`. `like`'s names were checked when it was made, and a
  Struct is immutable, so its name table is shared. Where TFF's Struct has
  other fields than these, the checked constructor is used.
  """
  if not _FAST_STRUCTS:
    return structure.Struct(list(zip(structure.name_list_with_nones(like), values)))
  struct = object.__new__(structure.Struct)
  struct._element_array = tuple(values)  # pylint: disable=protected-access
  struct._name_array = like._name_array  # pylint: disable=protected-access
  struct._name_to_index = like._name_to_index  # pylint: disable=protected-access
  struct._hash = None  # pylint: disable=protected-access
  struct._elements_cache = None  # pylint: disable=protected-access
  return struct


def federated_parts(x):
  """The `Federated` values in `x` (one, or the leaves of a structure)."""
  if isinstance(x, Federated):
    yield x
  elif isinstance(x, structure.Struct):
    for e in structure.iter_elements(x):
      yield from federated_parts(e[1])


def _struct_elements(value, type_spec: computation_types.StructType) -> list:
  """The elements of a Python container `value`, in the order of `type_spec`.

  The containers a learning process passes (dicts, attrs classes such as
  `ModelWeights`, tuples and lists) are read directly: `structure.from_container`
  gave the same elements, ~0.3 ms for a small server state (runtime `Protocol`
  checks), a sixth of a small round's Python. Where the type names every
  element, a named container (dict, `Struct`, attrs class, namedtuple) is read
  by name; otherwise by position. Missing, extra or surplus elements raise
  `TypeError` rather than being dropped or matched by position.
  """
  if isinstance(value, (list, tuple)) and not hasattr(value, '_fields'):  # unnamed
    if len(value) != len(type_spec):
      raise _mismatch(value, type_spec)
    return list(value)
  names = [name for name, _ in structure.iter_elements(type_spec)]
  named = None not in names
  if isinstance(value, dict):
    if not named or len(value) != len(names) or any(n not in value for n in names):
      raise _mismatch(value, type_spec)
    return [value[name] for name in names]
  if isinstance(value, structure.Struct):
    items = structure.to_elements(value)
  elif attr.has(type(value)):
    items = [(field.name, getattr(value, field.name)) for field in attr.fields(type(value))]
  elif isinstance(value, tuple):  # a namedtuple
    items = list(zip(value._fields, value))
  else:
    items = structure.to_elements(structure.from_container(value))
  if len(items) != len(names):
    raise _mismatch(value, type_spec)
  if named and None not in (k for k, _ in items):
    if [k for k, _ in items] == names:
      return [v for _, v in items]
    by_name = dict(items)
    if set(by_name) != set(names):
      raise _mismatch(value, type_spec)
    return [by_name[name] for name in names]
  return [v for _, v in items]


def _mismatch(value, type_spec) -> TypeError:
  return TypeError(f'In-process backend: a {type(value).__name__} that does not match '
                   f'{type_spec} (its elements: {_describe(value)}).')


def _describe(value) -> str:
  if isinstance(value, dict):
    return ', '.join(map(str, value))
  if isinstance(value, structure.Struct):
    return ', '.join(str(k) for k, _ in structure.iter_elements(value))
  if attr.has(type(value)):
    return ', '.join(f.name for f in attr.fields(type(value)))
  if hasattr(value, '_fields'):
    return ', '.join(value._fields)
  try:
    return f'{len(value)} unnamed'
  except TypeError:
    return type(value).__name__


def ingest(value, type_spec):
  """A Python value of `type_spec` -> the interpreter's representation."""
  if isinstance(type_spec, computation_types.FederatedType):
    if type_spec.placement is placements.CLIENTS and not type_spec.all_equal:
      return Federated(placements.CLIENTS, [ingest(v, type_spec.member) for v in value], False)
    return Federated(type_spec.placement, ingest(value, type_spec.member), True)
  if isinstance(type_spec, computation_types.StructType):
    return struct_like(type_spec, [ingest(v, t) for t, v in zip(
        type_spec, _struct_elements(value, type_spec))])
  if isinstance(type_spec, computation_types.SequenceType):
    if not isinstance(value, tf.data.Dataset):
      raise TypeError(f'In-process backend: expected a tf.data.Dataset for {type_spec}, '
                      f'got {type(value).__name__}.')
    return value
  if isinstance(type_spec, computation_types.TensorType):
    if isinstance(value, tf.Tensor):
      if value.dtype == type_spec.dtype:
        return value
      value = value.numpy()  # converted below, as TFF converts a tensor of another dtype
    if value is None:  # np.asarray(None, float32) would be nan
      raise TypeError(f'In-process backend: None given for {type_spec}.')
    tensor = _tensor_of(value)
    if tensor is not None and tensor.dtype == type_spec.dtype:
      return tensor
    return tf.constant(np.asarray(value, dtype=type_spec.dtype))
  raise TypeError(f'In-process backend: cannot ingest a value of type {type_spec}.')


def materialise(value):
  """The interpreter's representation -> what a RemoteExecutor's compute() gives."""
  if isinstance(value, Federated):
    if value.all_equal:
      return materialise(value.value)
    return [materialise(v) for v in value.value]
  if isinstance(value, structure.Struct):
    return struct_like(value, [materialise(v) for v in value])
  if isinstance(value, tf.Tensor):
    return _array_of(value)
  return value


# id(array) -> (weak reference to the array, the tensor it shows), for the
# arrays `materialise` returns; an entry goes with its array.
_SHOWN: dict = {}


def _array_of(tensor: tf.Tensor):
  """The tensor's values as a read-only numpy array over its own buffer (no copy).

  A result fed back to the next call (the state of a round, clients' states)
  is then that tensor again (`_tensor_of`): no copy either way. `numpy()`
  copied every result (the state of a 1.2M-parameter model: 4.8 MB), and
  `tf.constant` copied it back. Read-only, since writing into it would change
  the tensor: an in-place change raises instead of going unseen.
  """
  array = tensor._numpy()  # pylint: disable=protected-access
  if not isinstance(array, np.ndarray):  # a scalar (numpy's, or bytes)
    if isinstance(array, np.generic):
      _remember_scalar(array, tensor)
    return array
  array.flags.writeable = False
  key = id(array)
  _SHOWN[key] = (weakref.ref(array, lambda _, key=key: _SHOWN.pop(key, None)), tensor)
  return array


def _tensor_of(value):
  """The tensor a read-only array (or numpy scalar) from `_array_of` shows;
  None for anything else."""
  if isinstance(value, np.generic):
    entry = _SCALARS.get(id(value))
    return entry[1] if entry is not None and entry[0] is value else None
  entry = _SHOWN.get(id(value))
  if entry is None or entry[0]() is not value:
    return None
  return entry[1]


# id(scalar) -> (the numpy scalar, its tensor), for the last `_MAX_SCALARS`
# scalars `materialise` returned. Numpy scalars take no weak references, so
# the entry keeps its scalar (its id is not reused while it is here). A round's
# scalar state (round number, schedule values) then goes back in without a
# `tf.constant` each (~15 us; 6 a round of the quadratic toy).
_SCALARS: dict = {}
_MAX_SCALARS = 1024


def _remember_scalar(scalar: np.generic, tensor: tf.Tensor) -> None:
  if len(_SCALARS) >= _MAX_SCALARS:
    _SCALARS.pop(next(iter(_SCALARS)), None)  # the oldest
  _SCALARS[id(scalar)] = (scalar, tensor)
