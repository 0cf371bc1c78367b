"""The DP-FedAvg samplers, whose rounds draw independently: `PoissonSampler` (each client
with probability q) and `FixedSizeSampler` (m clients uniformly without replacement).
"""

from typing import Hashable, Optional, Sequence

import numpy as np

from tff_dp import ledger
from tff_dp.sampling.base import Sampler
from tff_dp.sampling.base import check_probability
from tff_dp.sampling.base import check_sample_size


class PoissonSampler(Sampler):
  """Includes each client independently with probability q (may return no client).

  `probability_given`: q was fixed before the data was seen (an input of the run, used
  whatever the population), which the add/remove claim needs; False (the default, the safe
  reading) when q was computed from this population, e.g. m / N: a neighbour with one client
  more would run with another q, so only zero-out holds (`tff_dp.accounting.claims`)."""

  def __init__(self, client_ids: Sequence[Hashable], probability: float,
               seed: Optional[int] = None, probability_given: bool = False):
    super().__init__(client_ids, seed)
    self.probability = check_probability(probability)
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

class FixedSizeSampler(Sampler):
  """Samples exactly `sample_size` distinct clients uniformly (without replacement)."""

  def __init__(self, client_ids: Sequence[Hashable], sample_size: int,
               seed: Optional[int] = None):
    super().__init__(client_ids, seed)
    self.sample_size = check_sample_size(sample_size, len(self.client_ids))

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
