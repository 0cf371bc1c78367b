"""`CyclicPoissonSampler`: amplified BandMF's sampling (each client's group drawn from a
secret key, the groups visited cyclically, Poisson within the group).
"""

from typing import Hashable, Optional, Sequence

import numpy as np

from tff_dp import errors
from tff_dp import ledger
from tff_dp.sampling.base import Sampler
from tff_dp.sampling.base import check_probability
from tff_dp.sampling.base import derived_key
from tff_dp.sampling.base import epoch_of
from tff_dp.sampling.base import id_bytes
from tff_dp.sampling.base import keyed_words
from tff_dp.sampling.base import non_negative_int


class CyclicPoissonSampler(Sampler):
  """Every client draws its group independently and uniformly among `groups` (balls into
  bins: keyed BLAKE2b of its id modulo `groups`, a bias below groups / 2^64); round r visits
  group (r - 1) % groups and includes each of its clients independently with `probability`
  (may return no client). So a client can only participate every `groups` rounds, at most
  once per cycle: the sampling of amplified BandMF (Choquette-Choo et al. 2023, Theorem 4),
  `groups` = the strategy's bands. Adding a client moves no other client between groups (an
  equal split by rank would: then only zero-out holds), which is what its add/remove claim
  needs (`tff_dp.accounting.claims`; jax_privacy's PartitionType.INDEPENDENT).

  The partition is a secret key's (kept beside the checkpoints as `ShuffledSampler`'s); each
  round's Poisson draw is `Sampler`'s, from OS randomness or from the seed. `epoch(r)` is the
  cycle of round r. `probability_given` as `PoissonSampler`'s."""

  def __init__(self, client_ids: Sequence[Hashable], groups: int, probability: float,
               seed: Optional[int] = None, key: Optional[bytes] = None,
               probability_given: bool = False):
    super().__init__(client_ids, seed)
    self.probability_given = bool(probability_given)
    groups = non_negative_int(groups, 'groups')
    if not 1 <= groups <= len(self.client_ids):
      raise errors.UserInputError(
          f'groups must be in [1, {len(self.client_ids)}] (the population), got {groups}.')
    self.groups = self.rounds_per_epoch = groups
    self.probability = check_probability(probability)
    self.key = derived_key(self.seed, key)
    words = keyed_words(self.key, b'group', id_bytes(self.client_ids))
    self._group = (words % np.uint64(groups)).astype(np.int64)

  @property
  def expected_clients_per_round(self) -> float:
    return self.probability * len(self.client_ids) / self.groups

  def epoch(self, round_num: int) -> int:
    """The 1-based cycle of 1-based round `round_num`."""
    return epoch_of(round_num, self.groups)

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
