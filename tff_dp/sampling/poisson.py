"""`PoissonSampler`, DP-FedAvg's sampling: each client independently with probability q, every
round alike (Poisson subsampling, the amplification the DP-FedAvg analysis assumes)."""

from typing import Hashable, Optional, Sequence

import dp_accounting
import numpy as np

from tff_dp import errors
from tff_dp import ledger
from tff_dp.sampling.base import Sampler
from tff_dp.sampling.base import check_probability
from tff_dp.sampling.kind import SamplerKind
from tff_dp.sampling.kind import SamplerRequest


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
    return ledger.SamplingEvent(kind=KIND.name, population_size=len(self.client_ids),
                                probability=self.probability, seeded=not self.secret,
                                probability_given=self.probability_given)


def _build(request: SamplerRequest) -> PoissonSampler:
  return PoissonSampler(request.client_ids, request.probability, seed=request.seed,
                        probability_given=request.probability_given)


def _production_event(event, population: int, cohort: int, round_num: int):
  """M of N at q = M / N, derived or given as the run's q was (the same claim)."""
  del round_num   # Every round alike.
  return ledger.SamplingEvent(KIND.name, population, probability=cohort / population,
                              probability_given=event.probability_given)


def _statement(event) -> dict:
  return {'probability': event.probability,
          'accounted_as': 'Poisson subsampling with this probability (exact)'}


def _independent_event(event, relation: str, inner):
  """Poisson subsampling, exact under add/remove, and under zero-out with q derived from the
  population (the same pair of outputs: `tff_dp.accounting.events`)."""
  if relation == 'replace_one':
    raise errors.UserInputError(
        "Poisson sampling is accounted under neighboring relation 'add_remove' (or "
        "'replace_special' when q is derived from the population) only; use add_remove.")
  return dp_accounting.PoissonSampledDpEvent(sampling_probability=float(event.probability),
                                             event=inner)


KIND = SamplerKind(
    name='poisson', title='Poisson',
    description=('each client independently with q = clients_per_round / population (what the '
                 'accountant assumes)'),
    build=_build, with_rate=True, production_event=_production_event, statement=_statement,
    independent_event=_independent_event)
