"""The secret random directions of a run's canary clients (Andrew et al., ICLR 2024, Sec. 3-4).

A canary client's update is a fixed unit vector c_k in R^d, scaled so that every configured
clip cuts it to the clip norm. The estimate rests on each direction being isotropic and unknown
to whatever produced the rest of the update (real clients, noise): for a direction independent
of the model change, the cosine is ~ N(0, 1/d). Hence the directions come from secret
randomness, like the samplers' and the noise's (`tff_dp.sampling`): a 32-byte key from
`os.urandom` unless a seed is given (tests).

The family: one secret standard normal base vector g in R^D, D >= d the smallest length FFTs
handle fast (`scipy.fft.next_fast_len`), and a distinct secret cyclic shift s_k per canary:
c_k = v_k / |v_k| with v_k the first d entries of roll(g, s_k) (roll as `np.roll` and
`tf.roll`: entry i of v_k is g[(i - s_k) mod D]). Each v_k is d iid standard normals, so c_k is
uniform on the sphere, exactly like independent draws; two canaries' windows of g give a cosine
~ N(0, 1/d), as two independent directions do, except for a common offset of order 1/d (with
D = d the cosines of all d - 1 nonzero shifts sum to (sum g)^2/|g|^2 - 1, a chi2_1 - 1
variable), invisible next to the null's 1/sqrt(d) spread. Why this family and not K
independent draws: the cosines of a model change Delta with all K + K' directions are one
circular cross-correlation of Delta (zero-padded to D) with g, read at the shifts, O(D log D)
by FFT whatever K is (`cosines`, in single precision: ~25 ms at the EMNIST CNN's d = 1.2M,
where an awkward length such as d itself took 0.5 s; 0.13 s at 5M weights). Independent
directions cost O(K d) per pass (~8.5 ns per entry: 1,000 directions of the EMNIST CNN took
~10 s here), too slow for the all-iterates statistic, which needs the cosines of every round's
model change. A client builds its canary's update from (shift, base seed, D) alone
(`tff_dp.canaries.insertion`), so nothing of size d crosses to the workers.

Inserted canaries are group 'inserted' (indices 0..K-1), never-inserted ones 'unseen'
(0..K'-1). Shifts are drawn without replacement, inserted first, so adding unseen canaries
leaves the inserted ones as they were (and adding canaries of a group leaves the group's first
ones as they were). The base vector comes from `base_fn(seed, dim)` with
`seed = base_seed()`: the numpy default here (tests, numpy-only use), or TensorFlow's stateless
normal in a run (`insertion.tf_base_vector`), which the clients compute identically.

The key is what a run keeps beside its checkpoints to regenerate the same canaries on resume;
it must never go to the config, metrics or logs, and `repr` leaves it out.
"""

import math
import os
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
from scipy import fft

from tff_dp.errors import UserInputError

INSERTED = 'inserted'
UNSEEN = 'unseen'
GROUPS = (INSERTED, UNSEEN)
KEY_BYTES = 32
# SeedSequence spawn keys of the independent streams one key seeds.
_BASE_STREAM, _INSERTED_STREAM, _UNSEEN_STREAM, _COIN_STREAM = 0, 1, 2, 3

BaseFn = Callable[[tuple[int, int], int], np.ndarray]


def _count(value: Any, name: str, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise UserInputError(f'`{name}` must be an integer >= {minimum}, got {value!r}')
  return int(value)


def new_key() -> bytes:
  """A fresh secret key for a run's canaries."""
  return os.urandom(KEY_BYTES)


def coin_inserted(candidates: int, *, seed: Optional[int] = None,
                  key: Optional[bytes] = None) -> int:
  """How many of `candidates` canaries are inserted when each is inserted independently
  with probability 1/2 (a Binomial(candidates, 1/2) draw from the key's or seed's own stream).

  `CanaryDirections(dim, that many, candidates - that many, same key)` then inserts a uniformly
  random subset of that size of exchangeable directions: with a binomial size, a uniformly
  random subset of all 2^candidates, i.e. one fair coin per canary, as the one-run bound
  (`audit.one_run_lower_bound`) requires."""
  candidates = _count(candidates, 'candidates', 0)
  if (seed is None) == (key is None):
    raise UserInputError('give `seed` or `key`')
  entropy = int.from_bytes(key, 'big') if key is not None else _count(seed, 'seed', 0)
  stream = np.random.SeedSequence(entropy, spawn_key=(_COIN_STREAM,))
  return int(np.random.Generator(np.random.PCG64(stream)).binomial(candidates, 0.5))


def numpy_base_vector(seed: tuple[int, int], dim: int) -> np.ndarray:
  """A standard normal base vector [dim] from numpy's PCG64 seeded with `seed`."""
  return np.random.Generator(np.random.PCG64(list(seed))).standard_normal(dim)


class CanaryDirections:
  """Unit directions of `num_inserted` inserted and `num_unseen` unseen canaries in R^`dim`.

  `key`: the 32-byte secret (a resumed run's, from its key file); `seed`: an integer instead,
  reproducible and for tests only, since anyone who knows it knows the canaries; neither: a
  new key from `os.urandom`. `base_fn`: how the base vector is drawn from `base_seed()`
  (default `numpy_base_vector`; a run passes the TensorFlow draw its clients make).
  """

  def __init__(self, dim: int, num_inserted: int, num_unseen: int = 0, *,
               seed: Optional[int] = None, key: Optional[bytes] = None,
               base_fn: Optional[BaseFn] = None):
    self.dim = _count(dim, 'dim', 1)
    self.num_inserted = _count(num_inserted, 'num_inserted', 0)
    self.num_unseen = _count(num_unseen, 'num_unseen', 0)
    if self.num_inserted + self.num_unseen > self.dim:
      raise UserInputError(f'`num_inserted` + `num_unseen` ({self.num_inserted} + '
                           f'{self.num_unseen}) must be at most `dim` ({self.dim}): each canary '
                           'needs its own shift')
    if seed is not None and key is not None:
      raise UserInputError('give `seed` or `key`, not both')
    if key is not None:
      if not isinstance(key, bytes) or len(key) != KEY_BYTES:
        raise UserInputError(f'`key` must be {KEY_BYTES} bytes')
      self.key: Optional[bytes] = key
      entropy = int.from_bytes(key, 'big')
    elif seed is not None:
      self.key = None   # A seeded run has nothing secret to keep.
      entropy = _count(seed, 'seed', 0)
    else:
      self.key = os.urandom(KEY_BYTES)
      entropy = int.from_bytes(self.key, 'big')
    self._entropy = entropy
    self.length = int(fft.next_fast_len(self.dim, real=True))   # D: the base vector's length.
    self._base_fn = base_fn or numpy_base_vector
    self._shifts = self._draw_shifts()
    self._base: Optional[np.ndarray] = None
    self._base_spectrum: Optional[np.ndarray] = None
    self._norms: Optional[dict[str, np.ndarray]] = None

  def __repr__(self) -> str:   # The key stays out of any log line that prints this.
    return (f'CanaryDirections(dim={self.dim}, num_inserted={self.num_inserted}, '
            f'num_unseen={self.num_unseen})')

  def _stream(self, stream: int) -> np.random.SeedSequence:
    return np.random.SeedSequence(self._entropy, spawn_key=(stream,))

  def _draw_shifts(self) -> dict[str, np.ndarray]:
    # Prefixes of secret permutations: a canary's shift does not depend on how many others
    # there are (inserted ones not on the unseen count, and the reverse for unseen ones given
    # the inserted ones).
    inserted = np.random.Generator(np.random.PCG64(self._stream(_INSERTED_STREAM))).permutation(
        self.length)[:self.num_inserted]
    unseen = np.zeros(0, np.int64)
    if self.num_unseen:
      free = np.setdiff1d(np.arange(self.length), inserted)
      order = np.random.Generator(np.random.PCG64(self._stream(_UNSEEN_STREAM))).permutation(
          free.size)
      unseen = free[order[:self.num_unseen]]
    return {INSERTED: inserted.astype(np.int64), UNSEEN: unseen.astype(np.int64)}

  def base_seed(self) -> tuple[int, int]:
    """The two non-negative int64 seeds of the base vector (secret: derived from the key)."""
    words = self._stream(_BASE_STREAM).generate_state(2, np.uint64) >> np.uint64(1)
    return int(words[0]), int(words[1])

  def base(self) -> np.ndarray:
    """The base vector g: float64 [length] (drawn once, then kept)."""
    if self._base is None:
      base = np.asarray(self._base_fn(self.base_seed(), self.length), dtype=np.float64)
      if base.shape != (self.length,) or not np.all(np.isfinite(base)) or not base.any():
        raise ValueError(f'base_fn must return a finite non-zero vector of {self.length} '
                         'entries')
      self._base = base
    return self._base

  def _window_norms(self) -> dict[str, np.ndarray]:
    """{group: |v_k|}: the norm of each canary's window of d entries of roll(g, s_k)."""
    if self._norms is None:
      squares = self.base() ** 2
      cumulative = np.concatenate([[0.0], np.cumsum(np.concatenate([squares, squares]))])
      norms = {}
      for group, shifts in self._shifts.items():
        start = (-shifts) % self.length    # v_k[0] = g[-s_k mod D]; the window wraps around.
        norms[group] = np.sqrt(cumulative[start + self.dim] - cumulative[start])
      self._norms = norms
    return self._norms

  def count(self, group: str) -> int:
    """How many canaries `group` ('inserted' or 'unseen') has."""
    if group not in GROUPS:
      raise UserInputError(f'`group` must be {INSERTED!r} or {UNSEEN!r}, got {group!r}')
    return self.num_inserted if group == INSERTED else self.num_unseen

  def shifts(self, group: str) -> np.ndarray:
    """The cyclic shifts of `group`'s canaries, by index: int64 [number in the group]."""
    self.count(group)
    return self._shifts[group].copy()

  def direction(self, group: str, index: int) -> np.ndarray:
    """Direction `index` of `group` (`'inserted'` or `'unseen'`): float64 [dim], unit norm."""
    count = self.count(group)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not (
        0 <= index < count):
      raise UserInputError(f'`index` must be in [0, {count}) for {group} canaries, got {index!r}')
    window = np.roll(self.base(), int(self._shifts[group][index]))[:self.dim]
    return window / np.linalg.norm(window)

  def block(self, group: str, start: int, stop: int) -> np.ndarray:
    """Directions start..stop-1 of `group` as rows: float64 [stop - start, dim]."""
    count = self.count(group)
    start, stop = _count(start, 'start', 0), _count(stop, 'stop', 0)
    if not start <= stop <= count:
      raise UserInputError(
          f'`start` and `stop` must satisfy 0 <= start <= stop <= {count}, got {start}, {stop}')
    return np.stack([self.direction(group, i) for i in range(start, stop)]) if stop > start \
        else np.zeros((0, self.dim))

  def blocks(self, group: str, block_size: int = 100) -> Iterator[np.ndarray]:
    """All directions of `group`, in order, as row blocks of at most `block_size` rows
    (memory `block_size` x `dim`; `tff_dp.canaries.estimate` takes such an iterable)."""
    count = self.count(group)
    block_size = _count(block_size, 'block_size', 1)
    for start in range(0, count, block_size):
      yield self.block(group, start, min(start + block_size, count))

  def cosines(self, delta: Any) -> dict[str, np.ndarray]:
    """{group: cos(delta, c_k) for each of its canaries}, by one FFT cross-correlation.

    With delta zero-padded to D: delta . v_k = r[s_k], r[s] = sum_i delta_i g[(i - s) mod D]
    = irfft(rfft(delta) * conj(rfft(g)))[s], and cos = r[s_k] / (|delta| |v_k|). `delta` is a
    flat model change [dim], oriented as `estimate.cosines` says; a zero `delta` gives cosines
    0 (as `estimate.cosines`).
    """
    delta = np.asarray(delta, dtype=np.float64)
    if delta.shape != (self.dim,):
      raise UserInputError(f'`delta` must be a vector of {self.dim} entries, got shape '
                           f'{delta.shape}')
    if not np.all(np.isfinite(delta)):
      raise UserInputError('`delta` contains NaN or infinity')
    norm = float(np.linalg.norm(delta))
    if norm == 0.0:
      return {group: np.zeros(shifts.size) for group, shifts in self._shifts.items()}
    # Single-precision transforms: 0.13 s instead of 0.21 s per call at 5M weights (measured on
    # the 2-core CI machine), and a run makes one call per round. Their error, ~1e-7 of
    # |delta| |g| in each correlation, is ~4 orders of magnitude below the 1/sqrt(d) spread
    # of a cosine under the null, so the estimates do not see it.
    if self._base_spectrum is None:
      self._base_spectrum = np.conj(fft.rfft(self.base().astype(np.float32)))
    spectrum = fft.rfft(delta.astype(np.float32), n=self.length)
    correlation = fft.irfft(spectrum * self._base_spectrum, n=self.length)
    norms = self._window_norms()
    return {group: correlation[shifts].astype(np.float64) / (norm * norms[group])
            for group, shifts in self._shifts.items()}


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
