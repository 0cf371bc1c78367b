"""The correlated noise of a run, one round at a time, beside the training process.

Round t's noise is w_t = (C^-1 z)_t for fresh standard Gaussian draws z_t of the model's size.
Solving C w = z forward needs, for a BLT, one buffer per pair (w_t = z_t - sum_i omega_i s_i,
then s_i <- theta_i s_i + w_t) and, for `bands` coefficients, the last bands - 1 outputs
(w_t = (z_t - sum_j c_j w_{t-j}) / c_0). `advance` is pure: it returns the round's noise and
the next `StreamState`, sharing the banded buffers it keeps (a round costs one new model-sized
array), so that a caller can hold the state of the last completed round and that of a round in
flight for about one model copy more than the state itself.

The fresh draws of round t are a function of (seed, t) alone (`fresh_draws`, `round_draws`): a
round re-run after a stop draws the same z_t, and the seed with the buffers is everything a
checkpoint needs (both secret: they reveal the noise).
"""

import dataclasses
from typing import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class StreamState:
  """After `step` rounds: the buffers the next round needs (banded: newest output first)."""
  step: int
  buffers: tuple


@dataclasses.dataclass(frozen=True)
class Stream:
  """C^-1 applied forward, for a BLT (`buf_decay`, `output_scale`) or banded `coefs`."""
  buf_decay: tuple = ()
  output_scale: tuple = ()
  coefs: tuple = ()

  def __post_init__(self):
    if bool(self.buf_decay) == bool(self.coefs):
      raise ValueError('give a BLT (buf_decay, output_scale) or banded coefs, not both')
    if len(self.buf_decay) != len(self.output_scale):
      raise ValueError('a BLT has one output_scale per buf_decay')

  @property
  def num_buffers(self) -> int:
    """Model-sized arrays the state holds."""
    return len(self.buf_decay) if self.buf_decay else len(self.coefs) - 1

  def start(self, size: int, dtype=np.float32) -> StreamState:
    return StreamState(0, tuple(np.zeros(size, dtype) for _ in range(self.num_buffers)))

  def advance(self, state: StreamState, z: np.ndarray) -> tuple[np.ndarray, StreamState]:
    """(w for round state.step + 1, the state after it), for that round's fresh draws z."""
    scratch = np.empty_like(z)   # One temporary for the whole step: the state is large.
    if self.buf_decay:
      w = _minus_weighted_sum(z, self.output_scale, state.buffers, scratch)
      buffers = []
      for theta, s in zip(self.buf_decay, state.buffers):
        new = np.multiply(s, z.dtype.type(theta))
        new += w
        buffers.append(new)
      buffers = tuple(buffers)
    else:
      c0, rest = self.coefs[0], self.coefs[1:]
      w = _minus_weighted_sum(z, rest, state.buffers, scratch)
      w /= z.dtype.type(c0)
      buffers = ((w,) + state.buffers[:-1]) if rest else ()
    return w, StreamState(state.step + 1, buffers)

  def advance_round(self, state: StreamState,
                    draw: Callable[[int], np.ndarray]) -> tuple[np.ndarray, StreamState]:
    """`advance` with the round's draws given as `draw(k)` (the k-th; this stream takes one),
    as a noise feed gives any stream (a tree takes one per node it makes,
    `matrix_factorization.tree`)."""
    return self.advance(state, draw(0))


def _minus_weighted_sum(z: np.ndarray, weights: Sequence[float], arrays: Sequence[np.ndarray],
                        scratch: np.ndarray) -> np.ndarray:
  """z - sum_i weights_i arrays_i, in a new array, with `scratch` the only temporary."""
  out = z.copy()
  for weight, array in zip(weights, arrays):
    np.multiply(array, z.dtype.type(weight), out=scratch)
    out -= scratch
  return out


def fresh_draws(seed: int, round_num: int, size: int, dtype=np.float32) -> np.ndarray:
  """Round `round_num`'s standard Gaussian draws z_t, a function of (seed, round) alone."""
  return np.random.default_rng([seed, round_num]).standard_normal(size, dtype=dtype)


def round_draws(seed: int, round_num: int, size: int,
                dtype=np.float32) -> Callable[[int], np.ndarray]:
  """`draw(k)`: round `round_num`'s k-th standard Gaussian draw, a function of (seed, round, k)
  alone; the 0th is `fresh_draws(seed, round_num, size)`."""
  def draw(k: int) -> np.ndarray:
    if k == 0:
      return fresh_draws(seed, round_num, size, dtype)
    return np.random.default_rng([seed, round_num, k]).standard_normal(size, dtype=dtype)
  return draw
