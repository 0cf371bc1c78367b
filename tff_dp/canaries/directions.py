"""The secret random directions of a run's canary clients (Andrew et al., ICLR 2024, Sec. 3-4).

A canary client's update is a fixed unit vector c_k in R^d, drawn uniformly from the sphere
(a standard normal vector divided by its norm, so isotropic), scaled so that every configured
clip cuts it to the clip norm. The estimate rests on the directions being unknown to whatever
produced the rest of the update (real clients, noise): for a direction independent of the model
change, the cosine is ~ N(0, 1/d). Hence they come from secret randomness, like the samplers'
and the noise's (`tff_dp.sampling`): 128 bits of `os.urandom` unless a seed is given (tests).

Each direction is a pure function of (secret, group, index), with group 0 for inserted canaries
and 1 for unseen ones (drawn, never inserted): numpy's `SeedSequence(secret, spawn_key=(group,
index))` seeds its own PCG64 stream. So a direction can be regenerated on demand, in blocks of
any size, with the same result; nothing of size K x d has to stay in memory (K = 1,000 canaries
of a 1M-parameter model would be 8 GB), and adding unseen canaries leaves the inserted ones as
they were. For resume, `secret_state()` is what a checkpoint keeps; it must never go to the
config, metrics or logs, and `repr` leaves it out.

Cost: regenerating is one normal draw per entry, ~8.5 ns on one core of the 2-core CI machine,
so a pass over K directions of dimension d takes ~8.5e-9 K d seconds (1,000 directions of the
1.2M-weight EMNIST CNN: ~10 s). Fine for a final-model estimate at a few evaluation rounds; too
slow for an all-iterates pass every round at that size.
"""

import math
import os
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

from tff_dp.errors import UserInputError

INSERTED = 'inserted'
UNSEEN = 'unseen'
_GROUPS = {INSERTED: 0, UNSEEN: 1}
_SECRET_BITS = 128


def _count(value: Any, name: str, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise UserInputError(f'`{name}` must be an integer >= {minimum}, got {value!r}')
  return int(value)


class CanaryDirections:
  """Unit directions of `num_inserted` inserted and `num_unseen` unseen canaries in R^`dim`.

  `seed=None` (the default) draws the secret from `os.urandom`; an integer seed makes the
  directions reproducible and is for tests only, since anyone who knows it knows the canaries.
  """

  def __init__(self, dim: int, num_inserted: int, num_unseen: int = 0,
               seed: Optional[int] = None):
    self.dim = _count(dim, 'dim', 1)
    self.num_inserted = _count(num_inserted, 'num_inserted', 0)
    self.num_unseen = _count(num_unseen, 'num_unseen', 0)
    if seed is None:
      self._secret = int.from_bytes(os.urandom(_SECRET_BITS // 8), 'big')
    else:
      self._secret = _count(seed, 'seed', 0)

  def __repr__(self) -> str:   # The secret stays out of any log line that prints this.
    return (f'CanaryDirections(dim={self.dim}, num_inserted={self.num_inserted}, '
            f'num_unseen={self.num_unseen})')

  def secret_state(self) -> dict[str, Any]:
    """What a checkpoint keeps to regenerate the same directions on resume (secret).

    The secret is a decimal string, since 128-bit integers do not fit int64 tensors or JSON
    numbers everywhere.
    """
    return {'dim': self.dim, 'num_inserted': self.num_inserted, 'num_unseen': self.num_unseen,
            'secret': str(self._secret)}

  @classmethod
  def from_secret_state(cls, state: Mapping[str, Any]) -> 'CanaryDirections':
    """The directions `secret_state()` described (a resumed run's canaries)."""
    try:
      secret = int(state['secret'])
      return cls(int(state['dim']), int(state['num_inserted']), int(state['num_unseen']),
                 seed=secret)
    except (KeyError, TypeError, ValueError):
      raise UserInputError('canary state must have `dim`, `num_inserted`, `num_unseen` and '
                           '`secret` (as `secret_state()` returns)') from None

  def _number(self, group: str) -> int:
    if group not in _GROUPS:
      raise UserInputError(f'`group` must be {INSERTED!r} or {UNSEEN!r}, got {group!r}')
    return self.num_inserted if group == INSERTED else self.num_unseen

  def direction(self, group: str, index: int) -> np.ndarray:
    """Direction `index` of `group` (`'inserted'` or `'unseen'`): float64 [dim], unit norm."""
    count = self._number(group)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not (
        0 <= index < count):
      raise UserInputError(f'`index` must be in [0, {count}) for {group} canaries, got {index!r}')
    sequence = np.random.SeedSequence(self._secret, spawn_key=(_GROUPS[group], int(index)))
    vector = np.random.Generator(np.random.PCG64(sequence)).standard_normal(self.dim)
    return vector / np.linalg.norm(vector)

  def block(self, group: str, start: int, stop: int) -> np.ndarray:
    """Directions start..stop-1 of `group` as rows: float64 [stop - start, dim]."""
    count = self._number(group)
    start, stop = _count(start, 'start', 0), _count(stop, 'stop', 0)
    if not start <= stop <= count:
      raise UserInputError(
          f'`start` and `stop` must satisfy 0 <= start <= stop <= {count}, got {start}, {stop}')
    rows = np.empty((stop - start, self.dim))
    for row, index in enumerate(range(start, stop)):
      rows[row] = self.direction(group, index)
    return rows

  def blocks(self, group: str, block_size: int = 100) -> Iterator[np.ndarray]:
    """All directions of `group`, in order, as row blocks of at most `block_size` rows.

    Memory stays at `block_size` x `dim`; `tff_dp.canaries.estimate` takes such an iterable
    wherever it takes a directions matrix.
    """
    count = self._number(group)
    block_size = _count(block_size, 'block_size', 1)
    for start in range(0, count, block_size):
      yield self.block(group, start, min(start + block_size, count))


def dimension(shapes: Sequence[Sequence[int]]) -> int:
  """d = the number of entries of weights with these shapes (the canaries' dimension)."""
  return int(sum(math.prod(int(n) for n in shape) for shape in shapes))


def flatten(weights: Sequence[Any]) -> np.ndarray:
  """A list of weight arrays as one float64 vector, in list order, each in C order.

  The inverse of `as_weight_shapes`; use it for a model change before taking cosines.
  """
  arrays = [np.asarray(w, dtype=np.float64).reshape(-1) for w in weights]
  return np.concatenate(arrays) if arrays else np.zeros(0)


def as_weight_shapes(flat: np.ndarray, shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
  """A flat vector (a direction) cut into arrays of `shapes`, in order: a canary's update
  in the structure of the model's weights. The vector's length must be `dimension(shapes)`."""
  flat = np.asarray(flat)
  if flat.ndim != 1 or flat.size != dimension(shapes):
    raise UserInputError(f'`flat` must be a vector of {dimension(shapes)} entries (the '
                         f'`shapes`), got shape {flat.shape}')
  pieces, offset = [], 0
  for shape in shapes:
    shape = tuple(int(n) for n in shape)
    size = math.prod(shape)
    pieces.append(flat[offset:offset + size].reshape(shape))
    offset += size
  return pieces
