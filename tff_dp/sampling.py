# Longer than 350 lines: the five samplers with their ledger events and the keys that keep
# them secret, side by side, so that each is read beside the others it must match.
"""Client samplers and their privacy-ledger events; the sample is secret unless seeded.

The amplification the accountant applies (q) assumes nobody but the mechanism knows which
clients a round used. The Poisson kinds' q is given (`build_sampler(probability=...)`, fixed
before the data is seen: the claim is add/remove) or derived from the population (q = m / N:
zero-out, `tff_dp.accounting.claims`); each sampler records which in its events. So that
nobody knows a sample, by default (`seed=None`) every round's draw comes from the operating
system's CSPRNG (`os.urandom`): nothing in the run's outputs, config or checkpoints lets
anyone recompute a sample, and a resumed run simply draws fresh samples for
the rounds it (re-)executes (each execution is its own ledger record). With an explicit
integer `seed`, round r's draw is a function of (seed, r, client id): reproducible simulations
and resume, but whoever holds the seed knows every round's membership (the run's privacy
statement says so).

Every draw is keyed on client ids, never on positions in the population list: a client's
seeded draws, its place in a keyed permutation and its cyclic-Poisson group are functions of
the key (or seed) and its own id. So adding or removing one client leaves every other
client's seeded draws and group unchanged (what the add/remove claims need against a seed
holder, `tff_dp.accounting.claims`), and a population other than the recorded one is caught by
its digest (`population_digest`) instead of silently reshuffling a schedule.

A sampler draws each round once: `sample(r)` called again for the same round (the loop
prefetches round r+1's clients while round r runs) returns the same clients.

Accounting each sampler maps to (see `tff_dp.accounting.accountant`):
  * `PoissonSampler` -> `PoissonSampledDpEvent(q, ...)`, exact under add/remove-one
    neighbouring (RDP and PLD). This is the sampling the DP-FedAvg analysis assumes.
  * `FixedSizeSampler` (uniform without replacement, like TFF's `build_uniform_sampling_fn`
    without replacement) -> `SampledWithoutReplacementDpEvent(N, m, ...)` under replace-one
    (RDP only, exact); under add/remove it is approximated as Poisson with q = m / N, the
    common DP-FedAvg practice (not a proven bound; prefer PoissonSampler for a rigorous
    add/remove guarantee).
  * `ShuffledSampler` (each epoch a fresh secret permutation, consecutive blocks) -> tree
    aggregation (DP-FTRL) only: `SingleEpochTreeAggregationDpEvent` per epoch under
    replace-special, which needs each client at most once per epoch and no amplification.
    Unlike the others it must draw the same permutation again when a resumed run re-executes
    rounds of an epoch (or clients would participate twice in it), so its randomness is a
    secret key (32 bytes from the OS unless seeded) that a run keeps beside its checkpoints.
  * `MinSeparationSampler` (one secret permutation, its blocks visited cyclically) ->
    correlated-noise DP-FTRL under zero-out (its blocks have a fixed size: an added client
    would shift others between rounds), and `CyclicPoissonSampler` (each client's group drawn
    independently from a secret key, the groups visited cyclically, Poisson within the group)
    -> amplified BandMF under add/remove (`tff_dp.accounting.correlated`); keys as
    `ShuffledSampler`'s. Which relation each pair is proven under is the claim table's
    (`tff_dp.accounting.claims`).
"""

import hashlib
import operator
import os
from typing import Hashable, List, Optional, Sequence

import numpy as np

from tff_dp import choices
from tff_dp import errors
from tff_dp import ledger


def _check_population(client_ids: Sequence[Hashable]) -> List[Hashable]:
  ids = list(client_ids)
  if not ids:
    raise errors.UserInputError('client_ids is empty: there is no client to sample.')
  if len(set(ids)) != len(ids):
    raise errors.UserInputError('client_ids contains duplicates; each client must appear once.')
  return ids


def _non_negative_int(value, name: str) -> int:
  try:
    value = operator.index(value)
  except TypeError:
    raise errors.UserInputError(f'{name} must be an integer, got {value!r}.') from None
  if value < 0:
    raise errors.UserInputError(f'{name} must be non-negative, got {value}.')
  return int(value)


def _check_seed(seed) -> Optional[int]:
  return None if seed is None else _non_negative_int(seed, 'seed')


def _check_probability(probability) -> float:
  try:
    q = float(probability)
  except (TypeError, ValueError):
    raise errors.UserInputError(
        f'sampling probability must be a number, got {probability!r}.') from None
  if not 0.0 < q <= 1.0:  # Also rejects NaN.
    raise errors.UserInputError(f'sampling probability must be in (0, 1], got {q}.')
  return q


def _check_sample_size(sample_size, population: int) -> int:
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


def _id_bytes(client_ids: Sequence[Hashable]) -> List[bytes]:
  """What keyed draws hash of each client: its id as text (as `hold_out` does)."""
  return [str(cid).encode('utf-8') for cid in client_ids]


def _keyed_words(key: bytes, tag: bytes, ids: Sequence[bytes]) -> np.ndarray:
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


class _Sampler:
  """Draws each round once from secret (seed None) or seeded randomness."""

  key: Optional[bytes] = None   # The secret a resume needs to continue the schedule; None: none.
  rounds_per_epoch: Optional[int] = None   # None: rounds are not grouped into epochs.

  def __init__(self, client_ids: Sequence[Hashable], seed: Optional[int]):
    self.client_ids = _check_population(client_ids)
    self.seed = _check_seed(seed)
    self._drawn: dict[int, list] = {}
    self._id_hashes: Optional[np.ndarray] = None   # Seeded draws' per-client words.

  @property
  def secret(self) -> bool:
    """Whether the samples are known to nobody (no seed exists that reproduces them)."""
    return self.seed is None

  def sample(self, round_num: int) -> list:
    """Clients sampled for `round_num`, in population order (the same list if asked again)."""
    round_num = _non_negative_int(round_num, 'round_num')
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
      self._id_hashes = _keyed_words(b'', b'tff_dp.sampling seeded', _id_bytes(self.client_ids))
    return self._id_hashes

  def _draw(self, randomness, round_num: int) -> np.ndarray:
    """Indices (into `client_ids`) of round `round_num`'s clients, from `randomness`."""
    raise NotImplementedError


class PoissonSampler(_Sampler):
  """Includes each client independently with probability q (may return no client).

  `probability_given`: q was fixed before the data was seen (an input of the run, used
  whatever the population), which the add/remove claim needs; False (the default, the safe
  reading) when q was computed from this population, e.g. m / N: a neighbour with one client
  more would run with another q, so only zero-out holds (`tff_dp.accounting.claims`)."""

  def __init__(self, client_ids: Sequence[Hashable], probability: float,
               seed: Optional[int] = None, probability_given: bool = False):
    super().__init__(client_ids, seed)
    self.probability = _check_probability(probability)
    self.probability_given = bool(probability_given)

  @property
  def expected_clients_per_round(self) -> float:
    return self.probability * len(self.client_ids)

  def _draw(self, randomness, round_num: int) -> np.ndarray:
    del round_num   # Every round alike.
    everyone = np.arange(len(self.client_ids))
    return np.flatnonzero(randomness.uniform(everyone) < self.probability)

  def sampling_event(self, round_num: Optional[int] = None) -> ledger.SamplingEvent:
    del round_num   # The same every round.
    return ledger.SamplingEvent(kind='poisson', population_size=len(self.client_ids),
                                probability=self.probability, seeded=not self.secret,
                                probability_given=self.probability_given)


class FixedSizeSampler(_Sampler):
  """Samples exactly `sample_size` distinct clients uniformly (without replacement)."""

  def __init__(self, client_ids: Sequence[Hashable], sample_size: int,
               seed: Optional[int] = None):
    super().__init__(client_ids, seed)
    self.sample_size = _check_sample_size(sample_size, len(self.client_ids))

  @property
  def expected_clients_per_round(self) -> float:
    return float(self.sample_size)

  def _draw(self, randomness, round_num: int) -> np.ndarray:
    del round_num   # Every round alike.
    return randomness.choice(len(self.client_ids), self.sample_size)

  def sampling_event(self, round_num: Optional[int] = None) -> ledger.SamplingEvent:
    del round_num   # The same every round.
    return ledger.SamplingEvent(kind='fixed_size', population_size=len(self.client_ids),
                                sample_size=self.sample_size, seeded=not self.secret)


KEY_BYTES = 32


def rounds_per_epoch(population_size: int, sample_size: int) -> int:
  """Rounds in an epoch of shuffled participation: N // m (the N mod m last clients of each
  epoch's permutation sit it out)."""
  return population_size // sample_size


def _epoch(round_num: int, rounds_per_epoch: int) -> int:
  """The 1-based epoch of 1-based round `round_num`."""
  round_num = _non_negative_int(round_num, 'round_num')
  if round_num < 1:
    raise errors.UserInputError(f'round_num must be >= 1, got {round_num}.')
  return (round_num - 1) // rounds_per_epoch + 1


def _derived_key(seed: Optional[int], key: Optional[bytes]) -> bytes:
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


class _KeyedPermutations:
  """One pseudorandom order of the clients per epoch, a function of a secret 32-byte key.

  Epoch e's permutation sorts the clients by keyed BLAKE2b values of (e, client id): nobody
  without the key can predict an epoch's order from others' (numpy's generators would be
  predictable from their outputs), the same key gives the same orders after a resume, and a
  client's value does not depend on the other clients. `key` None draws 32 bytes from the OS
  (persist `key` to resume); an integer `seed` derives the key from it (reproducible, not
  secret from whoever holds the seed)."""

  def __init__(self, client_ids: Sequence[Hashable], seed: Optional[int],
               key: Optional[bytes]):
    self.key = _derived_key(seed, key)
    self._ids = _id_bytes(client_ids)
    self._epoch: Optional[int] = None
    self._permutation: Optional[np.ndarray] = None

  def __call__(self, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s order (indices into the population); the last epoch's is kept."""
    if epoch != self._epoch:
      values = _keyed_words(self.key, b'epoch %d' % epoch, self._ids)
      self._epoch, self._permutation = epoch, np.argsort(values, kind='stable')
    return self._permutation


class ShuffledSampler:
  """Epoch e is a permutation of the population; its rounds take consecutive blocks of it.

  With N clients and `sample_size` m an epoch has `rounds_per_epoch` = N // m rounds; round r
  (1-based) is in epoch (r - 1) // (N // m) + 1 and takes block (r - 1) % (N // m) of that
  epoch's permutation (the N mod m clients at its end sit the epoch out). So every client
  participates at most once per epoch, which the tree-aggregation accountant requires.

  The permutations are a secret `key`'s (`_KeyedPermutations`): `key` None draws a new one
  (`secret` is then True; persist `key` to resume), an integer `seed` derives it.
  """

  def __init__(self, client_ids: Sequence[Hashable], sample_size: int,
               seed: Optional[int] = None, key: Optional[bytes] = None):
    self.client_ids = _check_population(client_ids)
    self.sample_size = _check_sample_size(sample_size, len(self.client_ids))
    self.seed = _check_seed(seed)
    self._permutations = _KeyedPermutations(self.client_ids, self.seed, key)
    self.key = self._permutations.key
    self.rounds_per_epoch = rounds_per_epoch(len(self.client_ids), self.sample_size)

  @property
  def secret(self) -> bool:
    return self.seed is None

  @property
  def expected_clients_per_round(self) -> float:
    return float(self.sample_size)

  def epoch(self, round_num: int) -> int:
    """The 1-based epoch of 1-based round `round_num`."""
    return _epoch(round_num, self.rounds_per_epoch)

  def permutation(self, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s order of the population (indices into `client_ids`)."""
    return self._permutations(epoch)

  def sample(self, round_num: int) -> list:
    """The clients of `round_num`, in population order."""
    epoch = self.epoch(round_num)
    block = (round_num - 1) % self.rounds_per_epoch
    m = self.sample_size
    idx = np.sort(self.permutation(epoch)[block * m:(block + 1) * m])
    return [self.client_ids[i] for i in idx]

  def sampling_event(self, round_num: int) -> ledger.SamplingEvent:
    return ledger.SamplingEvent(kind='shuffled', population_size=len(self.client_ids),
                                sample_size=self.sample_size, epoch=self.epoch(round_num),
                                seeded=not self.secret)


class MinSeparationSampler(ShuffledSampler):
  """One secret permutation of the population, cut into P = N // m blocks visited cyclically:
  round r takes block (r - 1) % P, so a client participates every P rounds, at most
  ceil(rounds / P) times (the N mod m clients at the permutation's end never do). What
  correlated-noise DP-FTRL is accounted under (min separation P). Keys, seeds and secrecy as
  `ShuffledSampler`'s; `epoch(r)` is the cycle of round r."""

  @property
  def min_separation(self) -> int:
    return self.rounds_per_epoch

  def sample(self, round_num: int) -> list:
    block = (round_num - 1) % self.rounds_per_epoch
    m = self.sample_size
    idx = np.sort(self.permutation(1)[block * m:(block + 1) * m])
    return [self.client_ids[i] for i in idx]

  def sampling_event(self, round_num: int) -> ledger.SamplingEvent:
    return ledger.SamplingEvent(kind='min_separation', population_size=len(self.client_ids),
                                sample_size=self.sample_size, epoch=self.epoch(round_num),
                                seeded=not self.secret)


class CyclicPoissonSampler(_Sampler):
  """Every client draws its group independently and uniformly among `groups` (balls into
  bins: keyed BLAKE2b of its id modulo `groups`, a bias below groups / 2^64); round r visits
  group (r - 1) % groups and includes each of its clients independently with `probability`
  (may return no client). So a client can only participate every `groups` rounds, at most
  once per cycle: the sampling of amplified BandMF (Choquette-Choo et al. 2023, Theorem 4),
  `groups` = the strategy's bands. Adding a client moves no other client between groups (an
  equal split by rank would: then only zero-out holds), which is what its add/remove claim
  needs (`tff_dp.accounting.claims`; jax_privacy's PartitionType.INDEPENDENT).

  The partition is a secret key's (kept beside the checkpoints as `ShuffledSampler`'s); each
  round's Poisson draw is `_Sampler`'s, from OS randomness or from the seed. `epoch(r)` is the
  cycle of round r. `probability_given` as `PoissonSampler`'s."""

  def __init__(self, client_ids: Sequence[Hashable], groups: int, probability: float,
               seed: Optional[int] = None, key: Optional[bytes] = None,
               probability_given: bool = False):
    super().__init__(client_ids, seed)
    self.probability_given = bool(probability_given)
    groups = _non_negative_int(groups, 'groups')
    if not 1 <= groups <= len(self.client_ids):
      raise errors.UserInputError(
          f'groups must be in [1, {len(self.client_ids)}] (the population), got {groups}.')
    self.groups = self.rounds_per_epoch = groups
    self.probability = _check_probability(probability)
    self.key = _derived_key(self.seed, key)
    words = _keyed_words(self.key, b'group', _id_bytes(self.client_ids))
    self._group = (words % np.uint64(groups)).astype(np.int64)

  @property
  def expected_clients_per_round(self) -> float:
    return self.probability * len(self.client_ids) / self.groups

  def epoch(self, round_num: int) -> int:
    """The 1-based cycle of 1-based round `round_num`."""
    return _epoch(round_num, self.groups)

  def members(self, round_num: int) -> np.ndarray:
    """Indices (into `client_ids`) of the group round `round_num` visits."""
    self.epoch(round_num)   # Checks round_num.
    return np.flatnonzero(self._group == (round_num - 1) % self.groups)

  def _draw(self, randomness, round_num: int) -> np.ndarray:
    group = self.members(round_num)
    return group[randomness.uniform(group) < self.probability]

  def sampling_event(self, round_num: int) -> ledger.SamplingEvent:
    return ledger.SamplingEvent(kind='cyclic_poisson', population_size=len(self.client_ids),
                                probability=self.probability, epoch=self.epoch(round_num),
                                groups=self.groups, seeded=not self.secret,
                                probability_given=self.probability_given)


def holdout_key(seed: Optional[int]) -> bytes:
  """The key choosing held-out evaluation clients: 32 bytes from the OS, or derived from a
  sampling seed (reproducible, and then known to whoever holds the seed)."""
  if seed is None:
    return os.urandom(KEY_BYTES)
  return hashlib.sha256(b'tff_dp.sampling.hold_out seed %d' % _check_seed(seed)).digest()


def check_holdout_count(count: int, candidates: int) -> None:
  """Refuses holding out `count` of `candidates` clients unless at least one is held out and
  one is left."""
  if not 1 <= count < candidates:
    raise errors.UserInputError(f'`eval_holdout_clients={count}` must be in [1, {candidates}): '
                                f'held out from {candidates} clients (those with test data)')


def hold_out(client_ids: Sequence[Hashable], count: int, key: bytes
             ) -> tuple[List[Hashable], List[Hashable]]:
  """(held out, the rest, both in population order): the `count` clients with the smallest
  keyed BLAKE2b values of their ids. A function of the key and the ids only (not of their
  order), so a resume holds out the same clients; unpredictable without the key."""
  ids = _check_population(client_ids)
  check_holdout_count(count, len(ids))
  values = [hashlib.blake2b(str(cid).encode('utf-8'), key=key, digest_size=16).digest()
            for cid in ids]
  chosen = set(np.argsort(np.array(values, dtype=object), kind='stable')[:count].tolist())
  return ([c for i, c in enumerate(ids) if i in chosen],
          [c for i, c in enumerate(ids) if i not in chosen])


def population_digest(client_ids: Sequence[Hashable]) -> bytes:
  """SHA-256 of the population's ids (their text, sorted, each length-prefixed): what a resume
  compares with the recorded population (`KEY_BYTES` long, kept like a key under secret/). A
  function of the set of ids, not their order."""
  digest = hashlib.sha256(b'tff_dp.sampling population')
  for i in sorted(_id_bytes(_check_population(client_ids))):
    digest.update(len(i).to_bytes(8, 'big') + i)
  return digest.digest()


def load_key(path: str, what: str = 'shuffling key') -> Optional[bytes]:
  """The secret key stored at `path` (None if there is none yet); `what` names it in errors
  (a run keeps its shuffling key and its canary key this way, both of KEY_BYTES)."""
  try:
    with open(path, 'rb') as f:
      key = f.read()
  except FileNotFoundError:
    return None
  if len(key) != KEY_BYTES:
    raise errors.UserInputError(f'{path} is not a {what} ({len(key)} bytes, expected '
                                f'{KEY_BYTES}); it was damaged, and without it the run cannot '
                                'be resumed.')
  return key


def save_key(path: str, key: bytes) -> None:
  """Stores a secret key at `path`, readable by its owner only, durably (a resume needs it: a
  new shuffling key mid-epoch would let clients participate twice in the epoch; new canary
  directions would break the canary statistics)."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  try:
    os.write(fd, key)
    os.fsync(fd)
  finally:
    os.close(fd)


# `client_sampling` -> the sampler of `clients_per_round` clients (its expected number for the
# Poisson kinds) from a population (`build_sampler`); the Poisson kinds also take their rate q
# and whether it was given (`_rate`).
_SAMPLERS = {
    'poisson': lambda ids, m, seed, key, groups, rate: PoissonSampler(
        ids, rate[0], seed=seed, probability_given=rate[1]),
    'fixed_size': lambda ids, m, seed, key, groups, rate: FixedSizeSampler(ids, m, seed=seed),
    'shuffled': lambda ids, m, seed, key, groups, rate: ShuffledSampler(
        ids, m, seed=seed, key=key),
    'min_separation': lambda ids, m, seed, key, groups, rate: MinSeparationSampler(
        ids, m, seed=seed, key=key),
    'cyclic_poisson': lambda ids, m, seed, key, groups, rate: CyclicPoissonSampler(
        ids, groups, rate[0], seed=seed, key=key, probability_given=rate[1]),
}
choices.check_implemented(choices.CLIENT_SAMPLERS, _SAMPLERS, 'tff_dp.sampling')
# The samplers that include each client with a rate q (`probability`).
WITH_PROBABILITY = ('poisson', 'cyclic_poisson')


def cyclic_poisson_probability(population: int, clients_per_round: int, groups: int) -> float:
  """q = clients_per_round x groups / population: a group's round then samples
  `clients_per_round` clients on average."""
  q = clients_per_round * groups / population
  if q > 1:
    raise errors.UserInputError(
        f'cyclic Poisson sampling of {clients_per_round} clients per round from {groups} '
        f'groups of a population of {population} needs q = {q:.3g} > 1; use fewer '
        '`clients_per_round` or fewer `bands`')
  return q


def _rate(kind: str, population: int, clients_per_round: int, groups: Optional[int],
          probability: Optional[float]) -> tuple[Optional[float], bool]:
  """(q, whether it was given) of a Poisson kind: `probability` when given, else derived from
  the population so that a round samples `clients_per_round` clients on average."""
  if kind not in WITH_PROBABILITY:
    if probability is not None:
      raise errors.UserInputError(f'`sampling_probability` is the rate of '
                                  f'{choices.one_of(WITH_PROBABILITY)} sampling; '
                                  f'`client_sampling={kind}` draws `clients_per_round` clients')
    return None, False
  if probability is not None:
    return _check_probability(probability), True
  if kind == 'cyclic_poisson':
    return cyclic_poisson_probability(population, clients_per_round, groups), False
  return clients_per_round / population, False


def build_sampler(kind: str, client_ids: Sequence[Hashable], clients_per_round: int,
                  seed: Optional[int] = None, key: Optional[bytes] = None,
                  groups: Optional[int] = None,
                  probability: Optional[float] = None) -> _Sampler:
  """The `kind` sampler (a `choices.CLIENT_SAMPLERS` name) of `clients_per_round` clients;
  `key`: the permutation samplers' secret key (None: a new one, unless `seed` is given);
  `groups`: cyclic Poisson's number of groups (required by it, refused by the others);
  `probability`: the Poisson kinds' rate q, fixed before the data is seen (then their claim
  is add/remove); None: q is derived from the population (zero-out)."""
  if kind not in _SAMPLERS:
    raise errors.UserInputError(f'`client_sampling` must be one of '
                                f'{choices.one_of(_SAMPLERS)}, got {kind!r}')
  if (kind == 'cyclic_poisson') != (groups is not None):
    raise errors.UserInputError('cyclic Poisson sampling needs its number of groups (`bands`), '
                                'and only it takes one')
  ids = _check_population(client_ids)
  rate = _rate(kind, len(ids), clients_per_round, groups, probability)
  return _SAMPLERS[kind](ids, clients_per_round, seed, key, groups, rate)
