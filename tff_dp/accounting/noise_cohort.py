"""Noise-cohort simulation (as pfl-research's `noise_cohort_size`): a run trains
`clients_per_round` = m clients per round but adds the noise of a cohort of M, so that its
average has the noise-to-signal ratio of a production round of M clients; and the epsilon such
a production run would have, a projection.

The run scales every Gaussian query's noise by m / M (`NoiseCohort.scale`): the sum of m
clipped updates gets stddev z x clip x m / M, the average stddev z x clip / M, as an M-client
round's. The ledger records what the run executed (its own, much larger, epsilon: the only
guarantee its clients get). The projection replays each record as the production round it
stands for (`production_record`): the same clips, the noise before scaling (stddev / scale),
and the production sampling of M clients from `population` with the same sampler kind; for
tree noise the tree restarts every production epoch, and for correlated noise the strategy's
coefficients are accounted under the production schedule (every population // M rounds).
"""

import dataclasses
from typing import Optional

from tff_dp import errors
from tff_dp import ledger
from tff_dp import sampling


@dataclasses.dataclass(frozen=True)
class NoiseCohort:
  """A run of `clients_per_round` clients per round with the noise of `cohort_size`, projected
  onto a production population of `population` clients; `groups`: cyclic Poisson's (the
  bands), when the run samples that way."""
  cohort_size: int
  population: int
  clients_per_round: int
  groups: Optional[int] = None

  def __post_init__(self):
    if not self.clients_per_round <= self.cohort_size <= self.population:
      raise errors.UserInputError(
          f'`noise_cohort_size={self.cohort_size}` must be at least `clients_per_round` '
          f'({self.clients_per_round}) and at most `noise_population` ({self.population})')
    if self.groups is not None:
      try:
        sampling.cyclic_poisson_probability(self.population, self.cohort_size, self.groups)
      except errors.UserInputError:   # Said in the noise cohort's settings.
        raise errors.UserInputError(
            f'`noise_cohort_size={self.cohort_size}` from {self.groups} groups of '
            f'`noise_population={self.population}`: the production run would include each '
            'client of its group with q = noise_cohort_size x groups / noise_population > 1; '
            'use a larger population or fewer `bands`') from None

  @property
  def scale(self) -> float:
    """m / M: what the run multiplies every query's noise by."""
    return self.clients_per_round / self.cohort_size

  @property
  def rounds_per_epoch(self) -> int:
    """Production rounds between two participations of a client under the permutation
    samplers (`sampling.rounds_per_epoch` of M from the production population)."""
    return sampling.rounds_per_epoch(self.population, self.cohort_size)

  def production_sampling(self, event: ledger.SamplingEvent,
                          round_num: int) -> ledger.SamplingEvent:
    """The production sampling event of round `round_num`, the kind of the run's `event`."""
    # The production run's rate (of a sampler with one) is derived from its population as the
    # run's was, or given (fixed before its data) as the run's was: the same claim.
    return sampling.get(event.kind).production_event(event, self.population, self.cohort_size,
                                                     round_num)

  def production_record(self, record: ledger.RoundRecord) -> ledger.RoundRecord:
    """The production round `record` stands for (module docstring)."""
    r = record.round_num
    queries = tuple(ledger.GaussianSumQuery(q.name, q.l2_norm_clip, q.noise_stddev / self.scale)
                    for q in record.queries)
    leaf = None if record.tree_leaf is None else (r - 1) % self.rounds_per_epoch + 1
    noise = record.correlated
    follows_population = sampling.get(record.sampling.kind).production_noise
    if noise is not None and follows_population is not None:
      noise = follows_population(noise, self.rounds_per_epoch)
    return ledger.RoundRecord(r, self.production_sampling(record.sampling, r), queries, leaf,
                              noise, record.noise)
