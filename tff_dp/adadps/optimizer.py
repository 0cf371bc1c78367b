"""Client-side AdaDPS (federated Algorithm 3 of Li et al.): local steps on preconditioned grads.

`build_preconditioned(inner, scales)` is a `tff.learning.optimizers.Optimizer` that multiplies
every minibatch gradient by the fixed scales and hands it to `inner` (plain SGD in the paper and
the reference code). Used as `client_optimizer_fn` of `build_unweighted_fed_avg`, the resulting
client model delta is then clipped and noised by whichever DP aggregator is configured, so the
privacy accounting is untouched. TFF has no such wrapper, hence this small class; the scales are
graph constants (not optimizer state), so they are neither broadcast each round nor part of the
client-work state, and only `inner`'s hyperparameters are exposed.
"""

from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import coordinate_scales
from tff_dp.errors import UserInputError

_optimizer = tff.learning.optimizers


class _PreconditionedOptimizer(_optimizer.Optimizer):
  """g -> inner.next(state, w, g * scales), see `build_preconditioned`."""

  def __init__(self, inner: _optimizer.Optimizer, scales: Sequence[np.ndarray]):
    if not isinstance(inner, _optimizer.Optimizer):
      raise TypeError(f'inner must be a tff.learning.optimizers.Optimizer, got {type(inner)}')
    self._inner = inner
    self._scales = [np.asarray(s, np.float32) for s in scales]

  def initialize(self, specs: Any):
    # Not checked against the scales here: TFF also calls this with a placeholder scalar spec
    # just to read the hyperparameters. `next` checks the real gradient shapes at trace time.
    return self._inner.initialize(specs)

  def next(self, state, weights, gradients):
    gradients = _optimizer.handle_indexed_slices_gradients(gradients)
    flat = tf.nest.flatten(gradients)
    coordinate_scales.validate_scales(
        self._scales, [tuple(w.shape) for w in tf.nest.flatten(weights)])
    scaled = []
    for g, s in zip(flat, self._scales):
      if g is None or coordinate_scales.is_identity(s):
        scaled.append(g)
      else:
        scaled.append(g * tf.constant(s, dtype=g.dtype))
    return self._inner.next(state, weights, tf.nest.pack_sequence_as(gradients, scaled))

  def get_hparams(self, state):
    return self._inner.get_hparams(state)

  def set_hparams(self, state, hparams):
    return self._inner.set_hparams(state, hparams)


def build_preconditioned(inner: _optimizer.Optimizer,
                         scales: Sequence[np.ndarray]) -> _optimizer.Optimizer:
  """Wraps any TFF optimizer so each step uses `gradient * scales` (scales per trainable weight,
  broadcastable to it, in `trainable_variables` order)."""
  scales = [np.asarray(s, np.float32) for s in scales]
  for i, s in enumerate(scales):
    if not np.all(np.isfinite(s)) or np.any(s < 0):
      raise UserInputError(f'scales for weight {i} must be finite and non-negative')
  return _PreconditionedOptimizer(inner, scales)


def build_preconditioned_sgd(learning_rate: float, scales: Sequence[np.ndarray],
                             momentum: Optional[float] = None) -> _optimizer.Optimizer:
  """Local SGD with preconditioned gradients: w <- w - lr * (g * scales) (Algorithm 3)."""
  return build_preconditioned(
      _optimizer.build_sgdm(learning_rate=learning_rate, momentum=momentum), scales)
