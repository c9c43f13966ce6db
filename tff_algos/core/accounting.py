"""Communication cost from TFF value types (not hand-written tables).

A client downloads the parameter of the per-client computation except its
dataset (model weights, broadcast hyperparameters and statistics) and uploads
its result (update, weight, metrics). Sizes come from the tensor types.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_federated as tff


def type_bytes(type_spec: tff.Type) -> int:
  """Bytes of one value of `type_spec` (sequences count as 0: they stay local)."""
  if isinstance(type_spec, tff.TensorType):
    shape = tuple(type_spec.shape)
    if any(d is None for d in shape):
      raise ValueError(f'cannot size a tensor of unknown shape: {type_spec}')
    dtype = getattr(type_spec.dtype, 'as_numpy_dtype', type_spec.dtype)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
  if isinstance(type_spec, tff.StructType):
    return sum(type_bytes(t) for t in type_spec)
  if isinstance(type_spec, tff.FederatedType):
    return type_bytes(type_spec.member)
  if isinstance(type_spec, tff.SequenceType):
    return 0
  raise TypeError(f'unsupported type {type_spec}')


@dataclasses.dataclass(frozen=True)
class ClientTraffic:
  download_bytes: int   # per participating client per round
  upload_bytes: int
  model_bytes: int      # trainable weights, the paper's unit

  @property
  def download_models(self) -> float:
    return self.download_bytes / self.model_bytes

  @property
  def upload_models(self) -> float:
    return self.upload_bytes / self.model_bytes


def client_traffic(client_computation: tff.Computation,
                   model_weights_type: tff.Type) -> ClientTraffic:
  sig = client_computation.type_signature
  params = sig.parameter
  down = sum(type_bytes(p) for p in params if not isinstance(p, tff.SequenceType))
  return ClientTraffic(download_bytes=down, upload_bytes=type_bytes(sig.result),
                       model_bytes=type_bytes(model_weights_type.trainable))


@dataclasses.dataclass(frozen=True)
class ComputeModel:
  """What an algorithm's clients compute beyond plain local SGD (paper 004 App. B).

  Client FLOPs per round = (fwd+bwd FLOPs per example) x (examples trained on)
  + optimizer_flops_per_param x |x| x (local steps) + the extra gradient passes
  named here. The model-dependent fwd+bwd count is measured, not tabulated.
  """
  optimizer_flops_per_param: float = 2.0   # plain SGD: y <- y - lr * g
  # Extra gradient evaluations per client and round, besides local training:
  # None, 'full_batch' (Mimelite: grad f_i(x_t) over the whole local dataset)
  # or 'one_batch' (MimeXlite: one minibatch gradient at x_t).
  extra_gradient: str | None = None

  def __post_init__(self):
    if self.extra_gradient not in (None, 'full_batch', 'one_batch'):
      raise ValueError(f'extra_gradient must be None, full_batch or one_batch, '
                       f'got {self.extra_gradient!r}')
