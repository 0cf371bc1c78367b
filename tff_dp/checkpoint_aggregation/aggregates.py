"""Aggregates of server-model checkpoints: EMA (with warm-up) and the uniform past-k average.

Both operate on model weights given as a flat `list[np.ndarray]` (trainable then non-trainable,
docs/ARCHITECTURE.md Contract 4). Checkpoints of a DP run are DP, so any function of them is free
post-processing (Shejwalkar et al., "Recycling Scraps", Sec. 3, Lemma 2).

State for checkpoints: `get_state()` returns a dict with a *fixed* set of keys whose values are
numpy arrays, also before the first update, because the training loop restores a checkpoint into
the structure of a freshly built aggregate (`tff.program.FileProgramStateManager` maps the saved
tree onto it). Tensor shapes and dtypes are therefore encoded as arrays (`ranks`, `dims`,
`dtypes`), and the numbers themselves are one flat vector (EMA) or a `[filled, size]` matrix
(past-k). Restoring and continuing is bit-identical to an uninterrupted run.

Only floating-point tensors are averaged; integer/bool tensors (counters, if a model has any) take
the value of the latest checkpoint, since an average of them has no meaning.
"""

import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from tff_dp.errors import UserInputError

# Dtype codes stored in checkpoints (index into this tuple); append only.
_DTYPES = ('float32', 'float64', 'float16', 'int32', 'int64', 'int8', 'int16', 'uint8', 'bool')

SCHEDULES = ('warmup', 'constant', 'bias_corrected')


class _Layout:
  """Shapes and dtypes of a flat weight list, and its encoding as checkpointable arrays."""

  def __init__(self, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[np.dtype]):
    self.shapes = [tuple(int(d) for d in s) for s in shapes]
    self.dtypes = [np.dtype(d) for d in dtypes]
    self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
    self.offsets = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)]).astype(int)
    self.size = int(self.offsets[-1])
    self.is_float = [np.issubdtype(d, np.floating) for d in self.dtypes]
    # Positions of the flat vector that are averaged (floating tensors) vs copied (the rest).
    self.float_mask = np.concatenate(
        [np.full(n, f) for n, f in zip(self.sizes, self.is_float)] or [np.zeros(0, bool)])
    self.all_float = all(self.is_float)
    # Storage dtype of raw checkpoints (past-k buffer): exact for every tensor.
    self.storage_dtype = np.result_type(np.float32, *self.dtypes)
    if self.storage_dtype == np.float16:
      self.storage_dtype = np.dtype(np.float32)

  @classmethod
  def of(cls, weights: Sequence[np.ndarray]) -> '_Layout':
    for w in weights:
      if w.dtype.name not in _DTYPES:
        raise UserInputError(
            f'checkpoint aggregation supports weight dtypes {", ".join(_DTYPES)}; got {w.dtype}')
    return cls([w.shape for w in weights], [w.dtype for w in weights])

  def check(self, weights: Sequence[np.ndarray], what: str) -> None:
    if len(weights) != len(self.shapes):
      raise UserInputError(
          f'{what}: expected {len(self.shapes)} weight arrays (as in the first checkpoint), '
          f'got {len(weights)}')
    for i, (w, shape) in enumerate(zip(weights, self.shapes)):
      if w.shape != shape:
        raise UserInputError(
            f'{what}: weight array {i} has shape {w.shape}, expected {shape} '
            '(as in the first checkpoint)')

  def flatten(self, weights: Sequence[np.ndarray], dtype) -> np.ndarray:
    out = np.empty(self.size, dtype=dtype)
    for w, lo, hi in zip(weights, self.offsets[:-1], self.offsets[1:]):
      out[lo:hi] = w.reshape(-1)
    return out

  def unflatten(self, flat: np.ndarray) -> list[np.ndarray]:
    return [flat[lo:hi].reshape(shape).astype(dtype)
            for lo, hi, shape, dtype in zip(self.offsets[:-1], self.offsets[1:],
                                            self.shapes, self.dtypes)]

  def encode(self) -> dict[str, np.ndarray]:
    return {
        'ranks': np.array([len(s) for s in self.shapes], dtype=np.int64),
        'dims': np.array([d for s in self.shapes for d in s], dtype=np.int64),
        'dtypes': np.array([_DTYPES.index(d.name) for d in self.dtypes], dtype=np.int64),
    }

  @classmethod
  def decode(cls, state: Mapping[str, Any]) -> '_Layout':
    ranks = np.asarray(state['ranks'], dtype=np.int64).reshape(-1)
    dims = np.asarray(state['dims'], dtype=np.int64).reshape(-1)
    codes = np.asarray(state['dtypes'], dtype=np.int64).reshape(-1)
    if len(codes) != len(ranks) or int(ranks.sum()) != len(dims):
      raise UserInputError('corrupt checkpoint-aggregate state: ranks/dims/dtypes disagree')
    shapes, pos = [], 0
    for r in ranks:
      shapes.append(tuple(int(d) for d in dims[pos:pos + r]))
      pos += r
    return cls(shapes, [_DTYPES[c] for c in codes])


def _as_arrays(weights: Sequence[Any]) -> list[np.ndarray]:
  if isinstance(weights, np.ndarray) or not isinstance(weights, Sequence):
    raise UserInputError(
        'model weights must be a flat list of arrays (trainable then non-trainable), got '
        f'{type(weights).__name__}')
  return [np.asarray(w) for w in weights]


def _scalar(state: Mapping[str, Any], key: str) -> np.ndarray:
  try:
    return np.asarray(state[key]).reshape(())
  except KeyError:
    raise UserInputError(f'checkpoint-aggregate state lacks key {key!r}') from None


class EMAAggregate:
  """Exponential moving average of checkpoints, Eq. (3) of Recycling Scraps (Sec. 3.1).

  Eq. (3): theta^EMA_t = (1 - beta_t) * theta^EMA_{t-1} + beta_t * theta_t, where beta_t there is
  the weight of the newest checkpoint. Here `beta` is the usual EMA *decay* (weight of the old
  average, e.g. 0.9, 0.999), so beta_t of Eq. (3) is `1 - decay_t`, and `schedule` sets decay_t
  for checkpoint t = 0, 1, 2, ... (theta^EMA_0 = theta_0 in every schedule):

  * 'warmup' (default): decay_t = min(beta, (1 + t) / (10 + t)), the EMA warm-up of
    De et al. 2022 (DP image classification; TF `ExponentialMovingAverage(num_updates=t)`),
    which Recycling Scraps' EMA builds on: early, poor checkpoints are forgotten quickly.
  * 'constant': decay_t = beta for t >= 1.
  * 'bias_corrected': Adam-style m_t / (1 - beta^(t+1)) with m_{-1} = 0, i.e. Eq. (3) with
    beta_t = (1 - beta) / (1 - beta^(t+1)).

  beta = 0 gives the last iterate. `value()` is None until the first update.
  """

  def __init__(self, beta: float, schedule: str = 'warmup'):
    try:
      beta = float(beta)
    except (TypeError, ValueError):
      raise UserInputError(f'EMA beta must be a number in [0, 1), got {beta!r}') from None
    if not 0.0 <= beta < 1.0 or math.isnan(beta):
      raise UserInputError(f'EMA beta must be in [0, 1) (the decay of the average), got {beta}')
    if schedule not in SCHEDULES:
      raise UserInputError(
          f'EMA schedule must be one of {", ".join(SCHEDULES)}, got {schedule!r}')
    self.beta = beta
    self.schedule = schedule
    self._count = 0
    self._layout: Optional[_Layout] = None
    self._value: Optional[np.ndarray] = None   # float64 flat vector

  @property
  def label(self) -> str:
    """What the aggregate is, for a plot's legend."""
    return f'EMA of the models (beta = {self.beta:g}, {self.schedule})'

  @property
  def count(self) -> int:
    """Number of checkpoints folded in so far."""
    return self._count

  def weight_of_latest(self, t: int) -> float:
    """beta_t of Eq. (3): the weight given to checkpoint number t (0-based) when it arrives."""
    if t <= 0:
      return 1.0
    if self.schedule == 'warmup':
      return 1.0 - min(self.beta, (1.0 + t) / (10.0 + t))
    if self.schedule == 'constant':
      return 1.0 - self.beta
    return (1.0 - self.beta) / (1.0 - self.beta ** (t + 1))

  def update(self, weights: Sequence[Any]) -> None:
    """Folds in the next checkpoint (flat list of arrays)."""
    weights = _as_arrays(weights)
    if self._layout is None:
      self._layout = _Layout.of(weights)
    self._layout.check(weights, 'EMAAggregate.update')
    x = self._layout.flatten(weights, np.float64)
    w = self.weight_of_latest(self._count)
    if self._value is None or w == 1.0:
      self._value = x
    else:
      new = (1.0 - w) * self._value + w * x
      if not self._layout.all_float:
        new = np.where(self._layout.float_mask, new, x)
      self._value = new
    self._count += 1

  def value(self) -> Optional[list[np.ndarray]]:
    """The current EMA as a flat list (original shapes and dtypes), or None before any update."""
    if self._value is None:
      return None
    return self._layout.unflatten(self._value)

  def get_state(self) -> dict[str, np.ndarray]:
    layout = self._layout or _Layout([], [])
    state = {
        'beta': np.array(self.beta, np.float64),
        'schedule': np.array(SCHEDULES.index(self.schedule), np.int64),
        'count': np.array(self._count, np.int64),
        'value': (self._value if self._value is not None
                  else np.zeros(0, np.float64)).copy(),
    }
    state.update(layout.encode())
    return state

  def set_state(self, state: Mapping[str, Any]) -> None:
    beta = float(_scalar(state, 'beta'))
    schedule = SCHEDULES[int(_scalar(state, 'schedule'))]
    if beta != self.beta or schedule != self.schedule:
      raise UserInputError(
          f'the checkpoint holds an EMA with beta={beta:g}, schedule={schedule!r}, but this run '
          f'is configured with beta={self.beta:g}, schedule={self.schedule!r}; use the same '
          'settings to resume')
    count = int(_scalar(state, 'count'))
    value = np.asarray(state['value'], dtype=np.float64).reshape(-1)
    if count == 0:
      self._count, self._layout, self._value = 0, None, None
      return
    layout = _Layout.decode(state)
    if value.size != layout.size:
      raise UserInputError('corrupt EMA state: value size does not match the stored shapes')
    self._count, self._layout, self._value = count, layout, value.copy()


class PastKAverage:
  """Uniform average of the last k checkpoints (Recycling Scraps, Sec. 3.1), in a ring buffer.

  Before k checkpoints have arrived it averages all of them. The average is summed in
  chronological order in float64, so a restored aggregate gives bit-identical values.
  """

  def __init__(self, k: int):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
      raise UserInputError(f'past-k average needs an integer k >= 1, got {k!r}')
    self.k = int(k)
    self._count = 0
    self._layout: Optional[_Layout] = None
    self._buffer: Optional[np.ndarray] = None   # [k, size], slot = checkpoint index % k

  @property
  def label(self) -> str:
    """What the aggregate is, for a plot's legend."""
    return f'average of the last {self.k} models'

  @property
  def count(self) -> int:
    """Number of checkpoints seen so far (the average covers the last min(count, k))."""
    return self._count

  def update(self, weights: Sequence[Any]) -> None:
    """Adds the next checkpoint, dropping the oldest once k are held."""
    weights = _as_arrays(weights)
    if self._layout is None:
      self._layout = _Layout.of(weights)
      self._buffer = np.zeros((self.k, self._layout.size), self._layout.storage_dtype)
    self._layout.check(weights, 'PastKAverage.update')
    self._buffer[self._count % self.k] = self._layout.flatten(weights, self._buffer.dtype)
    self._count += 1

  def _chronological_slots(self) -> list[int]:
    n = min(self._count, self.k)
    return [(self._count - n + i) % self.k for i in range(n)]

  def value(self) -> Optional[list[np.ndarray]]:
    """Mean of the last min(count, k) checkpoints, or None before any update."""
    if self._count == 0:
      return None
    slots = self._chronological_slots()
    acc = np.zeros(self._layout.size, np.float64)
    for s in slots:
      acc += self._buffer[s]
    acc /= len(slots)
    if not self._layout.all_float:
      latest = self._buffer[slots[-1]].astype(np.float64)
      acc = np.where(self._layout.float_mask, acc, latest)
    return self._layout.unflatten(acc)

  def models(self) -> list[list[np.ndarray]]:
    """The kept checkpoints themselves, oldest first (at most k)."""
    if not self._count:
      return []
    return [self._layout.unflatten(self._buffer[s]) for s in self._chronological_slots()]

  def get_state(self) -> dict[str, np.ndarray]:
    layout = self._layout or _Layout([], [])
    if self._count:
      checkpoints = self._buffer[self._chronological_slots()].copy()
    else:
      checkpoints = np.zeros((0, 0), np.float32)
    state = {'k': np.array(self.k, np.int64), 'count': np.array(self._count, np.int64),
             'checkpoints': checkpoints}
    state.update(layout.encode())
    return state

  def set_state(self, state: Mapping[str, Any]) -> None:
    k = int(_scalar(state, 'k'))
    if k != self.k:
      raise UserInputError(
          f'the checkpoint holds a past-k average with k={k}, but this run is configured with '
          f'k={self.k}; use the same k to resume')
    count = int(_scalar(state, 'count'))
    if count == 0:
      self._count, self._layout, self._buffer = 0, None, None
      return
    layout = _Layout.decode(state)
    checkpoints = np.asarray(state['checkpoints'])
    n = min(count, k)
    if checkpoints.shape != (n, layout.size):
      raise UserInputError(
          f'corrupt past-k state: checkpoints have shape {checkpoints.shape}, expected '
          f'{(n, layout.size)}')
    buffer = np.zeros((k, layout.size), layout.storage_dtype)
    for i in range(n):
      buffer[(count - n + i) % k] = checkpoints[i]
    self._count, self._layout, self._buffer = count, layout, buffer
