"""The epsilons a run's privacy statement leads with when the per-round accountant's number is
not a proven bound against everyone:

* `without_amplification`: a seeded run's samples are known to whoever holds the seed, so
  against them no round is amplified by sampling: the run is the composition of every Gaussian
  release, itself one Gaussian with z = (sum over rounds and queries of z_g^-2)^-1/2 (exact,
  so PLD and RDP are those of one `GaussianDpEvent`). A re-executed round adds its queries
  like any other release. Amplified BandMF (cyclic Poisson) is then the matrix mechanism with
  a client in every cycle, its participations `groups` rounds apart: one Gaussian with the
  sensitivity of all of them.
* `fixed_size_proven`: sampling without replacement has a proven analysis under replace-one
  neighbouring only (`SampledWithoutReplacementDpEvent`, RDP); add/remove runs account it as
  Poisson(m/N), an approximation. dp_accounting computes that RDP in ~0.5 s per distinct
  event, and adaptive clipping makes every round's z_eff differ in its last bits, so rounds
  are grouped by z_eff rounded DOWN to `Z_GROUP_DIGITS` significant digits and each group is
  composed with its count: less noise only increases epsilon, so the result is an upper bound
  on the exact composition (within 1e-4 relative in z).

Both are functions of the ledger's records only (the same records the accountant replays).
`headline` chooses, for a run's claim, which epsilon a statement leads with: the one home of
that choice for the run's statement and for `tff_dp.privacy.PrivateAggregation`.
"""

import collections
import dataclasses
from typing import Dict, Mapping, Optional, Sequence

import dp_accounting

from tff_dp import ledger
from tff_dp import noise_budget
from tff_dp.accounting import accountant
from tff_dp.accounting import claims
from tff_dp.accounting import correlated_rounds

Z_GROUP_DIGITS = 4


def without_amplification(records: Sequence[ledger.RoundRecord], delta: float,
                          methods: Sequence[str], neighboring_relation: str = 'add_remove'
                          ) -> Dict[str, Optional[float]]:
  """{method: epsilon} of `records` against someone who knows every round's sample."""
  z = _multiplier_without_amplification(records, neighboring_relation)
  if z == 0.0:
    return {m: float('inf') for m in methods}
  if z == float('inf'):
    return {m: 0.0 for m in methods}
  event = dp_accounting.GaussianDpEvent(z)
  relation = accountant.check_relation(neighboring_relation)
  out = {}
  for method in methods:
    if method == 'rdp':
      acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    else:
      acc = dp_accounting.pld.PLDAccountant(neighboring_relation=relation)
    out[method] = float(acc.compose(event).get_epsilon(delta))
  return out


def _multiplier_without_amplification(records: Sequence[ledger.RoundRecord],
                                      neighboring_relation: str) -> float:
  """The one Gaussian a known-sample run is: independent noise composes every release
  (z = (sum z_g^-2)^-1/2); correlated noise is one Gaussian whose sensitivity counts every
  participation the sampler allowed (`CorrelatedRounds.multiplier_without_amplification`)."""
  if records and records[0].correlated is not None:
    account = correlated_rounds.CorrelatedRounds((), neighboring_relation, ('rdp',), 1e-4)
    for record in records:
      account.compose(record)
    return account.multiplier_without_amplification()
  inverse_squares = 0.0
  for record in records:
    multipliers = accountant.gaussian_noise_multipliers(record, neighboring_relation)
    if multipliers is None:
      return 0.0
    inverse_squares += sum(z ** -2 for z in multipliers)
  return inverse_squares ** -0.5 if inverse_squares else float('inf')


def fixed_size_proven(records: Sequence[ledger.RoundRecord], delta: float) -> float:
  """RDP epsilon of fixed-size records under replace-one (sampling without replacement),
  grouped conservatively (module docstring); seeded re-executions merged first."""
  groups: collections.Counter = collections.Counter()
  for record in accountant.merged_records(records):
    multipliers = accountant.gaussian_noise_multipliers(record, 'replace_one')
    if multipliers is None:
      return float('inf')
    if not multipliers:
      continue
    z = noise_budget.effective_noise_multiplier(multipliers)
    s = record.sampling
    groups[(s.population_size, s.sample_size, accountant.round_down(z, Z_GROUP_DIGITS))] += 1
  if not groups:
    return 0.0
  acc = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  for (n, m, z), count in groups.items():
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        n, m, dp_accounting.GaussianDpEvent(z)), count)
  return float(acc.get_epsilon(delta))


@dataclasses.dataclass(frozen=True)
class Headline:
  """The epsilon a privacy statement leads with and the relation it holds under, with the
  numbers it replaces, each kept for a labelled mention.

  epsilon: {method: epsilon} of the headline.
  relation: the neighbouring relation of the headline (a `claims.RELATIONS` name).
  poisson_approximation: a fixed-size run's per-round accountant epsilons (add/remove Poisson
    approximation, not a proven bound), which the proven replace-one bound replaces.
  if_seed_secret: a seeded amplified run's amplified epsilons, which hold only while the seed
    stays secret; the headline is then `without_amplification`.
  """
  epsilon: Mapping[str, Optional[float]]
  relation: str
  poisson_approximation: Optional[Mapping[str, Optional[float]]] = None
  if_seed_secret: Optional[Mapping[str, Optional[float]]] = None


def headline(records: Sequence[ledger.RoundRecord], epsilons: Mapping[str, Optional[float]],
             delta: float, methods: Sequence[str], found: claims.Claim,
             seeded: bool) -> Headline:
  """The headline of a run whose accountant gave `epsilons` (under `found.columns_relation`)
  for `records`: the proven fixed-size bound replaces the Poisson approximation, and against
  a seed holder an amplified claim's epsilon gives way to the one without amplification."""
  result = Headline(dict(epsilons), found.relation)
  if found.sampler == 'fixed_size':
    result = Headline({'rdp': fixed_size_proven(records, delta)}, found.relation,
                      poisson_approximation=dict(epsilons))
  if seeded and found.amplified:
    result = dataclasses.replace(
        result, epsilon=without_amplification(records, delta, methods, found.relation),
        if_seed_secret=dict(result.epsilon))
  return result
