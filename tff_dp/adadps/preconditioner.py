"""Side information -> per-coordinate preconditioner scales (AdaDPS's A, applied as g * A).

Scales are a list with one float32 array per trainable weight, each broadcastable to that
weight's shape (a scalar 1 for weights the side information does not cover). The formulas follow
the AdaDPS reference code (litian96/AdaDPS):
  frequency:      min(cap, max(freq) / freq) / division   (imdb/trainers/dp-sgd.py, scale_by=freq)
  second moment:  1 / sqrt(v + eps)                        (use_public RMSProp preconditioner)
  rank:           1 for the top `num_frequent` tokens, `rare_scale` for the rest (the federated
                  StackOverflow code: grads[0][100:] *= 200)
"""

from typing import Sequence

import numpy as np

from tff_dp import choices
from tff_dp.adadps import side_information as si
from tff_dp.errors import UserInputError

Scales = list  # list[np.ndarray], one per trainable weight, broadcastable to it

# `auto` picks the formula that matches the side information kind.
PRECONDITIONERS = tuple(choices.PRECONDITIONERS)
_AUTO = {si.FREQUENCY: 'frequency', si.SECOND_MOMENT: 'second_moment', si.SCALES: 'direct'}

# Guards max(freq)/freq against freq == 0 (never-seen tokens then get `cap`), as in the reference.
_TINY = 1e-20


def frequency_multiplier(freq: np.ndarray, *, cap: float, division: float) -> np.ndarray:
  """min(cap, max(freq)/freq)/division: rare tokens get larger steps (up to cap/division)."""
  if cap <= 0 or division <= 0:
    raise UserInputError(f'precondition cap and division must be positive, got cap={cap}, '
                         f'division={division}')
  freq = np.asarray(freq, np.float64)
  if np.any(freq < 0):
    raise UserInputError('frequencies must be non-negative')
  return (np.minimum(cap, freq.max() / (freq + _TINY)) / division).astype(np.float32)


def second_moment_multiplier(v: np.ndarray, *, eps: float) -> np.ndarray:
  """1/sqrt(v + eps): the RMSProp denominator estimated on public data."""
  if eps <= 0:
    raise UserInputError(f'precondition eps must be positive, got {eps}')
  v = np.asarray(v, np.float64)
  if np.any(v < 0):
    raise UserInputError('second moments must be non-negative')
  return (1.0 / np.sqrt(v + eps)).astype(np.float32)


def rank_multiplier(freq: np.ndarray, *, num_frequent: int, rare_scale: float) -> np.ndarray:
  """1 for the `num_frequent` most frequent tokens, `rare_scale` for all others."""
  freq = np.asarray(freq)
  order = np.argsort(-freq.reshape(-1), kind='stable')
  out = np.full(freq.size, rare_scale, np.float32)
  out[order[:num_frequent]] = 1.0
  return out.reshape(freq.shape)


def build_scales(side_info: si.SideInformation, *, preconditioner: str = 'auto',
                 cap: float = 1000.0, division: float = 1.0, eps: float = 1e-8,
                 num_frequent: int = 100, rare_scale: float = 200.0) -> Scales:
  """Per-weight scales from side information; uncovered weights get scale 1.

  For frequencies, max(freq) is taken over all covered coordinates together, so that the most
  frequent token anywhere has multiplier 1/division.
  """
  if preconditioner not in PRECONDITIONERS:
    raise UserInputError(f'unknown preconditioner {preconditioner!r}; one of {PRECONDITIONERS}')
  if preconditioner == 'auto':
    preconditioner = _AUTO[side_info.kind]
  covered = [v for v in side_info.values if v is not None]
  if preconditioner == 'frequency' or preconditioner == 'rank':
    if side_info.kind != si.FREQUENCY:
      raise UserInputError(f'the {preconditioner} preconditioner needs frequency side '
                           f'information, got {side_info.kind}')
    flat = np.concatenate([v.reshape(-1) for v in covered])
    if preconditioner == 'frequency':
      mult = frequency_multiplier(flat, cap=cap, division=division)
    else:
      mult = rank_multiplier(flat, num_frequent=num_frequent, rare_scale=rare_scale)
    flat_scales, offset = [], 0
    for v in covered:
      flat_scales.append(mult[offset:offset + v.size].reshape(v.shape))
      offset += v.size
    it = iter(flat_scales)
    scales = [None if v is None else next(it) for v in side_info.values]
  elif preconditioner == 'second_moment':
    if side_info.kind != si.SECOND_MOMENT:
      raise UserInputError('the second_moment preconditioner needs second-moment side '
                           f'information, got {side_info.kind}')
    scales = [None if v is None else second_moment_multiplier(v, eps=eps)
              for v in side_info.values]
  else:  # direct
    scales = [None if v is None else np.asarray(v, np.float32) for v in side_info.values]
  return [np.ones((), np.float32) if s is None else s for s in scales]


def expand_scales(scales: Sequence[np.ndarray], weight_shapes: Sequence[tuple]
                  ) -> list[np.ndarray]:
  """Full-shape copies of the scales (for inspection / saving; not needed for training)."""
  return [np.broadcast_to(np.asarray(s, np.float32), tuple(shape)).copy()
          for s, shape in zip(scales, weight_shapes)]
