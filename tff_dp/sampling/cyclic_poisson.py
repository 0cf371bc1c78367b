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
from tff_dp.sampling.kind import SamplerKind
from tff_dp.sampling.kind import SamplerRequest


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
    return ledger.SamplingEvent(kind=KIND.name, population_size=len(self.client_ids),
                                probability=self.probability, epoch=self.epoch(round_num),
                                groups=self.groups, seeded=not self.secret,
                                probability_given=self.probability_given)


def probability(population: int, clients_per_round: int, groups: int) -> float:
  """q = clients_per_round x groups / population: a group's round then samples
  `clients_per_round` clients on average."""
  q = clients_per_round * groups / population
  if q > 1:
    raise errors.UserInputError(
        f'cyclic Poisson sampling of {clients_per_round} clients per round from {groups} '
        f'groups of a population of {population} needs q = {q:.3g} > 1; use fewer '
        '`clients_per_round` or fewer `bands`')
  return q


def _build(request: SamplerRequest) -> CyclicPoissonSampler:
  return CyclicPoissonSampler(request.client_ids, request.groups, request.probability,
                              seed=request.seed, key=request.key,
                              probability_given=request.probability_given)


def _production_event(event, population: int, cohort: int, round_num: int):
  """M of N a round from the run's number of groups (q checked against them), derived or
  given as the run's q was; the cycles are the run's (`groups` rounds each)."""
  del round_num   # The run's own cycle (its `epoch`).
  q = probability(population, cohort, event.groups)
  return ledger.SamplingEvent(KIND.name, population, probability=q, epoch=event.epoch,
                              groups=event.groups, probability_given=event.probability_given)


def _statement(event) -> dict:
  return {'probability': event.probability, 'groups': event.groups, 'accounted_as': (
      f'a secret partition of the population into {event.groups} groups visited cyclically '
      '(each client draws its group independently from a secret key, so adding a client '
      'moves no other), each client of the visited group independently with this '
      'probability (amplified '
      'BandMF, Choquette-Choo et al. 2023 Theorem 4: per cycle one Poisson-subsampled '
      'Gaussian whose sensitivity is the strategy\'s largest column norm, composed over the '
      'cycles; it assumes the bands never exceed the groups, which the run checked)')}


KIND = SamplerKind(
    name='cyclic_poisson', title='cyclic Poisson',
    description=('each client draws one of `bands` groups independently from a secret key; '
                 'the groups are visited cyclically, and in its group\'s round each client is '
                 'sampled independently with q = clients_per_round x bands / population '
                 '(amplified BandMF)'),
    build=_build, with_rate=True, keyed=True, grouped=True,
    production_event=_production_event, statement=_statement)
