"""The samplers of DP-FTRL, whose rounds are blocks of a secret keyed permutation:
`ShuffledSampler` (a fresh permutation each epoch: the tree) and `MinSeparationSampler` (one
permutation, its blocks visited cyclically: correlated noise).
"""

from typing import Hashable, Optional, Sequence

import numpy as np

from tff_dp import ledger
from tff_dp.sampling.base import check_population
from tff_dp.sampling.base import check_sample_size
from tff_dp.sampling.base import check_seed
from tff_dp.sampling.base import derived_key
from tff_dp.sampling.base import epoch_of
from tff_dp.sampling.base import id_bytes
from tff_dp.sampling.base import keyed_words


def rounds_per_epoch(population_size: int, sample_size: int) -> int:
  """Rounds in an epoch of shuffled participation: N // m (the N mod m last clients of each
  epoch's permutation sit it out)."""
  return population_size // sample_size

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
    self.key = derived_key(seed, key)
    self._ids = id_bytes(client_ids)
    self._epoch: Optional[int] = None
    self._permutation: Optional[np.ndarray] = None

  def __call__(self, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s order (indices into the population); the last epoch's is kept."""
    if epoch != self._epoch:
      values = keyed_words(self.key, b'epoch %d' % epoch, self._ids)
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
    self.client_ids = check_population(client_ids)
    self.sample_size = check_sample_size(sample_size, len(self.client_ids))
    self.seed = check_seed(seed)
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
    return epoch_of(round_num, self.rounds_per_epoch)

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
