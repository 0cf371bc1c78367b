"""What every sampler shares: its inputs' checks, the secret (OS) or seeded randomness of a
round's draw, per-client keyed words, and `Sampler`, which draws each round once.
"""

import hashlib
import operator
import os
from typing import Hashable, List, Optional, Sequence

import numpy as np

from tff_dp import errors


def check_population(client_ids: Sequence[Hashable]) -> List[Hashable]:
  ids = list(client_ids)
  if not ids:
    raise errors.UserInputError('client_ids is empty: there is no client to sample.')
  if len(set(ids)) != len(ids):
    raise errors.UserInputError('client_ids contains duplicates; each client must appear once.')
  return ids

def non_negative_int(value, name: str) -> int:
  try:
    value = operator.index(value)
  except TypeError:
    raise errors.UserInputError(f'{name} must be an integer, got {value!r}.') from None
  if value < 0:
    raise errors.UserInputError(f'{name} must be non-negative, got {value}.')
  return int(value)

def check_seed(seed) -> Optional[int]:
  return None if seed is None else non_negative_int(seed, 'seed')

def check_probability(probability) -> float:
  try:
    q = float(probability)
  except (TypeError, ValueError):
    raise errors.UserInputError(
        f'sampling probability must be a number, got {probability!r}.') from None
  if not 0.0 < q <= 1.0:  # Also rejects NaN.
    raise errors.UserInputError(f'sampling probability must be in (0, 1], got {q}.')
  return q

def check_sample_size(sample_size, population: int) -> int:
  try:
    m = operator.index(sample_size)
  except TypeError:
    raise errors.UserInputError(f'sample_size must be an integer, got {sample_size!r}.') \
        from None
  if not 1 <= m <= population:
    raise errors.UserInputError(
        f'sample_size must be in [1, {population}] (the population), got {m}.')
  return int(m)

def _unit_floats(words: np.ndarray) -> np.ndarray:
  """uint64 words as floats in [0, 1) with 53 random bits each."""
  return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53

def id_bytes(client_ids: Sequence[Hashable]) -> List[bytes]:
  """What keyed draws hash of each client: its id as text (as `hold_out` does)."""
  return [str(cid).encode('utf-8') for cid in client_ids]

def keyed_words(key: bytes, tag: bytes, ids: Sequence[bytes]) -> np.ndarray:
  """One uint64 per client: keyed BLAKE2b of (tag, id), unpredictable without the key."""
  return np.array([int.from_bytes(hashlib.blake2b(tag + b'\0' + i, key=key,
                                                  digest_size=8).digest(), 'big')
                   for i in ids], dtype=np.uint64)

def _splitmix64(x: np.ndarray) -> np.ndarray:
  """SplitMix64's finalizer (a bijection of uint64 that mixes every input bit into every
  output bit), vectorized; arrays wrap around modulo 2^64."""
  x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(0xFFFFFFFFFFFFFFFF)
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))

class _SecretRandomness:
  """Uniform draws from the OS CSPRNG (a CSPRNG because the draws are what must stay secret:
  numpy's generators are predictable from their outputs, `os.urandom` is not). Fresh draws
  are i.i.d., so which client gets which draw does not matter."""

  def uniform(self, indices: np.ndarray) -> np.ndarray:
    """One float in [0, 1) with 53 random bits per client index."""
    return _unit_floats(np.frombuffer(os.urandom(8 * len(indices)), dtype=np.uint64))

  def choice(self, n: int, m: int) -> np.ndarray:
    """m distinct indices of range(n), uniformly: the m smallest of n i.i.d. random keys."""
    keys = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    return np.argpartition(keys, m - 1)[:m] if m < n else np.arange(n)

class _SeededRandomness:
  """Reproducible draws keyed on client ids: client i's draw in round r is SplitMix64 of its
  id's hash mixed with a hash of (seed, r) (no state to keep). Not secret (the seed gives
  every draw away), so a fast mixer is enough; what matters is that a client's draw depends
  on no other client."""

  def __init__(self, seed: int, round_num: int, id_hashes: np.ndarray):
    digest = hashlib.sha256(b'tff_dp.sampling seeded round %d %d' % (seed, round_num)).digest()
    self._round = np.uint64(int.from_bytes(digest[:8], 'big'))
    self._id_hashes = id_hashes

  def uniform(self, indices: np.ndarray) -> np.ndarray:
    return _unit_floats(_splitmix64(_splitmix64(self._id_hashes[indices] ^ self._round)))

  def choice(self, n: int, m: int) -> np.ndarray:
    """The m clients of smallest draw: adding a client displaces at most one other."""
    return np.argsort(self.uniform(np.arange(n)), kind='stable')[:m]

class Sampler:
  """Draws each round once from secret (seed None) or seeded randomness."""

  key: Optional[bytes] = None   # The secret a resume needs to continue the schedule; None: none.
  rounds_per_epoch: Optional[int] = None   # None: rounds are not grouped into epochs.

  def __init__(self, client_ids: Sequence[Hashable], seed: Optional[int]):
    self.client_ids = check_population(client_ids)
    self.seed = check_seed(seed)
    self._drawn: dict[int, list] = {}
    self._id_hashes: Optional[np.ndarray] = None   # Seeded draws' per-client words.

  @property
  def secret(self) -> bool:
    """Whether the samples are known to nobody (no seed exists that reproduces them)."""
    return self.seed is None

  def sample(self, round_num: int) -> list:
    """Clients sampled for `round_num`, in population order (the same list if asked again)."""
    round_num = non_negative_int(round_num, 'round_num')
    if round_num not in self._drawn:
      randomness = (_SecretRandomness() if self.seed is None
                    else _SeededRandomness(self.seed, round_num, self._seeded_words()))
      idx = np.sort(self._draw(randomness, round_num))
      self._drawn[round_num] = [self.client_ids[i] for i in idx]
      for old in [r for r in self._drawn if r < round_num - 1]:
        del self._drawn[old]   # Only the current and the prefetched round are kept.
    return list(self._drawn[round_num])

  def _seeded_words(self) -> np.ndarray:
    if self._id_hashes is None:
      self._id_hashes = keyed_words(b'', b'tff_dp.sampling seeded', id_bytes(self.client_ids))
    return self._id_hashes

  def _draw(self, randomness, round_num: int) -> np.ndarray:
    """Indices (into `client_ids`) of round `round_num`'s clients, from `randomness`."""
    raise NotImplementedError

KEY_BYTES = 32

def epoch_of(round_num: int, rounds_per_epoch: int) -> int:
  """The 1-based epoch of 1-based round `round_num`."""
  round_num = non_negative_int(round_num, 'round_num')
  if round_num < 1:
    raise errors.UserInputError(f'round_num must be >= 1, got {round_num}.')
  return (round_num - 1) // rounds_per_epoch + 1

def derived_key(seed: Optional[int], key: Optional[bytes]) -> bytes:
  """The permutation samplers' key: `key`, or derived from `seed`, or 32 new bytes."""
  if seed is not None and key is not None:
    raise errors.UserInputError('give a sampling seed or a key, not both.')
  if seed is not None:
    key = hashlib.sha256(b'tff_dp.sampling.ShuffledSampler seed %d' % seed).digest()
  elif key is None:
    key = os.urandom(KEY_BYTES)
  if not isinstance(key, bytes) or len(key) != KEY_BYTES:
    raise errors.UserInputError(f'the shuffling key must be {KEY_BYTES} bytes.')
  return key
