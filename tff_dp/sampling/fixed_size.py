"""`FixedSizeSampler`: m clients uniformly without replacement each round (TFF's
`build_uniform_sampling_fn` without replacement), every round alike."""

from typing import Hashable, Optional, Sequence

import dp_accounting
import numpy as np

from tff_dp import errors
from tff_dp import ledger
from tff_dp.sampling.base import Sampler
from tff_dp.sampling.base import check_sample_size
from tff_dp.sampling.kind import SamplerKind
from tff_dp.sampling.kind import SamplerRequest


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
    return ledger.SamplingEvent(kind=KIND.name, population_size=len(self.client_ids),
                                sample_size=self.sample_size, seeded=not self.secret)


def _build(request: SamplerRequest) -> FixedSizeSampler:
  return FixedSizeSampler(request.client_ids, request.clients_per_round, seed=request.seed)


def _production_event(event, population: int, cohort: int, round_num: int):
  del event, round_num   # Every round alike.
  return ledger.SamplingEvent(KIND.name, population, sample_size=cohort)


def _statement(event) -> dict:
  return {'sample_size': event.sample_size, 'accounted_as': (
      'proven: sampling without replacement under replace-one (RDP); the epsilon_* columns '
      'use Poisson subsampling with q = sample_size / population under add/remove (the '
      'usual DP-FedAvg approximation, not a proven bound)')}


def _independent_event(event, relation: str, inner):
  """Under replace-one: sampling without replacement (exact, RDP only). Under add/remove:
  APPROXIMATED as Poisson subsampling with q = m / N, the common DP-FedAvg practice (McMahan
  et al. 2018; google-research/federated#20), not a proven bound: the statement labels it."""
  if relation == 'replace_special':
    raise errors.UserInputError(
        "fixed-size sampling is accounted under 'replace_one' (proven) or 'add_remove' (the "
        "Poisson approximation); 'replace_special' is for Poisson samples whose rate was "
        'derived from the population, tree-aggregation and correlated-noise ledgers.')
  if relation == 'add_remove':
    return dp_accounting.PoissonSampledDpEvent(
        sampling_probability=event.sample_size / event.population_size, event=inner)
  return dp_accounting.SampledWithoutReplacementDpEvent(
      source_dataset_size=event.population_size, sample_size=event.sample_size, event=inner)


KIND = SamplerKind(
    name='fixed_size', title='fixed-size',
    description=('exactly clients_per_round without replacement (accounted with the Poisson '
                 'formula under add/remove, or the without-replacement RDP bound under '
                 'replace-one)'),
    build=_build, production_event=_production_event, statement=_statement,
    independent_event=_independent_event)
