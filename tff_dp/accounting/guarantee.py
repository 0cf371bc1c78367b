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
`headline` chooses, for a run's claim, which epsilon a statement leads with; `of_records` is
that guarantee of a ledger, the one every surface reads (statement, console, summary, the
replay CLI, `tff_dp.privacy.PrivateAggregation`), and `predicted` the one a `max_epsilon`
cap is checked against.
"""

import collections
import dataclasses
from typing import Dict, Mapping, Optional, Sequence

import dp_accounting

from tff_dp import errors
from tff_dp import ledger
from tff_dp import noise_budget
from tff_dp.accounting import accountant
from tff_dp.accounting import claims
from tff_dp.accounting import noise_families

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
  participation the sampler allowed (`CorrelatedRounds.multiplier_without_amplification`), and
  so does a registered family's account, if it has that bound."""
  if records and (records[0].correlated is not None or records[0].noise is not None):
    account = noise_families.of_record(records[0]).account((), neighboring_relation, ('rdp',),
                                                           1e-4)
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


# What a headline's epsilon is (`Headline.basis`), as the statement and the replay CLI label it.
BASIS_TEXT = {
    'accountant': 'the accountant\'s epsilon of the recorded rounds',
    'amplified': 'the accountant\'s epsilon, amplified by secret sampling',
    'fixed_size_proven': 'the proven bound of fixed-size sampling (without replacement, '
                         'replace-one, RDP), not the Poisson approximation',
    'without_amplification': 'against anyone who holds the sampling seed (no amplification '
                             'by sampling)',
}


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
  basis: what the epsilon is (a `BASIS_TEXT` key).
  """
  epsilon: Mapping[str, Optional[float]]
  relation: str
  poisson_approximation: Optional[Mapping[str, Optional[float]]] = None
  if_seed_secret: Optional[Mapping[str, Optional[float]]] = None
  basis: str = 'accountant'

  @property
  def label(self) -> str:
    """What the headline's epsilon is, in words."""
    return BASIS_TEXT[self.basis]


def headline(records: Sequence[ledger.RoundRecord], epsilons: Mapping[str, Optional[float]],
             delta: float, methods: Sequence[str], found: claims.Claim,
             seeded: bool) -> Headline:
  """The headline of a run whose accountant gave `epsilons` (under `found.columns_relation`)
  for `records`: the proven fixed-size bound replaces the Poisson approximation, and against
  a seed holder an amplified claim's epsilon gives way to the one without amplification."""
  result = Headline(dict(epsilons), found.relation,
                    basis='amplified' if found.amplified else 'accountant')
  if found.per_round_relation is not None:   # The columns approximate: fixed-size's row.
    result = Headline({'rdp': fixed_size_proven(records, delta)}, found.relation,
                      poisson_approximation=dict(epsilons), basis='fixed_size_proven')
  if seeded and found.amplified:
    result = dataclasses.replace(
        result, epsilon=without_amplification(records, delta, methods, found.relation),
        if_seed_secret=dict(result.epsilon), basis='without_amplification')
  return result


def of_records(records: Sequence[ledger.RoundRecord], delta: float,
               methods: Sequence[str] = accountant.METHODS,
               epsilons: Optional[Mapping[str, Optional[float]]] = None,
               found: Optional[claims.Claim] = None, **accountant_kwargs) -> Headline:
  """The guarantee of a ledger's records: the one function every surface reads (the run's
  statement, console and summary, the `max_epsilon` cap through `predicted`, the ledger
  replay CLI and `tff_dp.privacy.PrivateAggregation`), so none can state another figure.

  The claim (relation, amplification) and whether the sample was seeded are read from the
  records themselves. `epsilons`: the per-round accountant's final epsilons of these records
  (under the claim's `columns_relation`) when the caller already composed them; else composed
  here (`accountant_kwargs` go to `LedgerAccountant`). `found`: the claim of a ledger with no
  record yet (epsilon 0).
  """
  found = claims.claim_for_records(records) or found
  if found is None:
    raise errors.UserInputError('a guarantee of no round needs the claim it would be under')
  if epsilons is None:
    acc = accountant.LedgerAccountant(delta, methods, found.columns_relation,
                                      **accountant_kwargs)
    for record in records:
      acc.add(record)
    epsilons = acc.epsilon(final=True)
  seeded = bool(records) and records[0].sampling.seeded
  return headline(records, epsilons, delta, methods, found, seeded)


def predicted(records: Sequence[ledger.RoundRecord], record: ledger.RoundRecord,
              acc: accountant.LedgerAccountant) -> float:
  """The headline epsilon if `record` were recorded after `records` (which `acc` has
  composed): what a `max_epsilon` cap is checked against before the round runs, so a run
  stops before its headline (not its per-round columns) would pass the cap. RDP when `acc`
  computes it (PLD otherwise), as `LedgerAccountant.peek_epsilon`."""
  method = 'rdp' if 'rdp' in acc.methods else 'pld'
  found = claims.claim_of_record(record)
  head = headline([*records, record], {method: acc.peek_epsilon(record)}, acc.delta,
                  (method,), found, record.sampling.seeded)
  return float(next(iter(head.epsilon.values())))
