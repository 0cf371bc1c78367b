"""Per-coordinate scales of model weights: the check and the no-op test shared by their users.

A list of float32 arrays, one per trainable weight, each broadcastable to that weight's shape
(a scalar 1 where nothing is scaled). Used by the scaling aggregator
(`aggregators.preconditioned`) and AdaDPS's preconditioned optimizer (`adadps.optimizer`); kept
here, below both, so that neither depends on the other (pure numpy, no TensorFlow).
"""

from typing import Sequence

import numpy as np

from tff_dp.errors import UserInputError


def validate_scales(scales: Sequence[np.ndarray], weight_shapes: Sequence[tuple],
                    *, require_positive: bool = False) -> list[np.ndarray]:
  """Checks scales against the weight shapes; returns them as float32 arrays."""
  scales = [np.asarray(s, np.float32) for s in scales]
  if len(scales) != len(weight_shapes):
    raise UserInputError(f'{len(scales)} scale arrays for {len(weight_shapes)} trainable weights')
  for i, (s, shape) in enumerate(zip(scales, weight_shapes)):
    shape = tuple(int(d) for d in shape)
    try:
      ok = np.broadcast_shapes(s.shape, shape) == shape
    except ValueError:
      ok = False
    if not ok:
      raise UserInputError(f'scales for weight {i} have shape {s.shape}, not broadcastable to '
                           f'the weight shape {shape}')
    if not np.all(np.isfinite(s)) or np.any(s < 0):
      raise UserInputError(f'scales for weight {i} must be finite and non-negative')
    if require_positive and np.any(s == 0):
      raise UserInputError(f'scales for weight {i} contain zeros; cannot un-scale')
  return scales


def is_identity(scale: np.ndarray) -> bool:
  """True when multiplying by `scale` is a no-op (skip it in the graph)."""
  return scale.ndim == 0 and float(scale) == 1.0
