"""A ledger record as a `dp_accounting` event: how a round of Gaussian sum queries on a sample
becomes a DpEvent, under each neighbouring relation (the sample's part is its sampler's
declaration, `SamplerKind.independent_event` in tff_dp/sampling/<kind>.py).

Each `RoundRecord` is one sampled round in which several Gaussian sum queries with privacy
tuples (S_g, sigma_g) ran on the same sample. By Eq. (1) of McMahan & Andrew (2018) they are
exactly one Gaussian sum query with noise multiplier

    z_eff = (sum_g (sigma_g / Delta_g)^-2)^-1/2,    Delta_g = S_g (add/remove) or 2 S_g
                                                    (replace-one: x -> x' moves the sum by 2S),

and the round is a sampled Gaussian mechanism with that z_eff.

Neighbouring relations and sampling (as the samplers declare them):
  * 'add_remove' (default, user-level DP as in DP-FedAvg):
      - poisson records -> PoissonSampledDpEvent(q, .) (exact; RDP and PLD).
      - fixed_size records -> APPROXIMATED as PoissonSampledDpEvent(m / N, .), the common
        DP-FedAvg practice (McMahan et al. 2018; google-research/federated#20). This is not a
        proven bound for sampling without replacement; use Poisson sampling for rigour.
  * 'replace_one':
      - fixed_size records -> SampledWithoutReplacementDpEvent(N, m, .) (exact; RDP only,
        dp_accounting's PLD accountant does not support this event).
      - poisson records are rejected (dp_accounting has no Poisson analysis for replace-one).
  * 'replace_special' (zero-out) with a rate derived from the population (`claims`): both
    sides share the population and so q, the zeroed client is drawn as before and contributes
    the zero vector, so the pair of outputs is exactly add/remove's at that q. dp_accounting
    0.4.3 composes PoissonSampledDpEvent under ADD_OR_REMOVE_ONE only, so these records are
    composed under it (`dp_accounting_relation`): the same privacy curve, not an
    approximation.
"""

import decimal
import functools
import importlib.metadata
import math
from typing import List, Optional

import dp_accounting

from tff_dp import errors
from tff_dp import ledger
from tff_dp import noise_budget
from tff_dp import sampling
from tff_dp.accounting import claims

NeighboringRelation = dp_accounting.NeighboringRelation
NEIGHBORING_RELATIONS = {
    'add_remove': NeighboringRelation.ADD_OR_REMOVE_ONE,
    'replace_one': NeighboringRelation.REPLACE_ONE,
    'replace_special': NeighboringRelation.REPLACE_SPECIAL,
}
# The relation tree-aggregation (DP-FTRL) ledgers are accounted under, and the only one.
TREE_RELATION = claims.ZERO_OUT


def check_relation(neighboring_relation: str) -> NeighboringRelation:
  if neighboring_relation not in NEIGHBORING_RELATIONS:
    raise errors.UserInputError(
        f'neighboring_relation must be one of {sorted(NEIGHBORING_RELATIONS)}, got '
        f'{neighboring_relation!r}.')
  return NEIGHBORING_RELATIONS[neighboring_relation]


def dp_accounting_relation(neighboring_relation: str, sampled: bool) -> NeighboringRelation:
  """The dp_accounting relation a record is composed under: a sampled (Poisson) record
  under zero-out is composed as add/remove (the module docstring: the same pair of
  outputs); anything else under its own."""
  if sampled and neighboring_relation == claims.ZERO_OUT:
    return NeighboringRelation.ADD_OR_REMOVE_ONE
  return check_relation(neighboring_relation)


def check_analysable(sampling_kind: str, noise: str) -> None:
  """UserInputError (one line saying what to use) for a sampling with no proof for this noise
  (`tff_dp.mechanisms.Mechanism.noise`): the claim table (`claims`) is the one list of proven
  pairs."""
  claims.check_proven(noise, sampling_kind)


@functools.lru_cache(maxsize=1)
def _installed_dp_accounting() -> str:
  return importlib.metadata.version('dp-accounting')


# The dp_accounting versions whose replace-one events take the Gaussian's multiplier with the
# sensitivity of the replacement already applied (sigma / 2S, `gaussian_noise_multipliers`).
# Later versions apply the relation inside the accountant, where our factor 2 would count it
# twice: replace-one is refused on them until checked again.
REPLACE_ONE_CHECKED_VERSIONS = ('0.4.',)


def _check_replace_one_version() -> None:
  version = _installed_dp_accounting()
  if not version.startswith(REPLACE_ONE_CHECKED_VERSIONS):
    raise errors.UserInputError(
        f'replace-one accounting was checked against dp_accounting 0.4 (the Gaussian\'s '
        f'multiplier given as sigma / 2S); dp_accounting {version} may apply the relation '
        'itself, which would count it twice: check `events.gaussian_noise_multipliers` first')


def gaussian_noise_multipliers(record: ledger.RoundRecord,
                                neighboring_relation: str) -> Optional[List[float]]:
  """Per-query sigma_g / Delta_g as Python floats; None if some query is non-private.

  Queries with S_g = 0 have zero sensitivity (no privacy cost) and are omitted.
  """
  if neighboring_relation == 'replace_one':
    _check_replace_one_version()
  factor = 2.0 if neighboring_relation == 'replace_one' else 1.0
  multipliers = []
  for q in record.queries:
    clip, stddev = float(q.l2_norm_clip), float(q.noise_stddev)
    if clip == 0.0:
      continue
    if stddev == 0.0:
      return None
    multipliers.append(stddev / (factor * clip))
  return multipliers


def _wrap_sampling(record: ledger.RoundRecord, neighboring_relation: str,
                   inner: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  """The round's event: `inner` on the recorded sample, as its sampler declares it
  (`SamplerKind.independent_event`), for a sampler the claim table proves it with."""
  s = record.sampling
  check_analysable(s.kind, claims.INDEPENDENT_NOISE)
  try:
    return sampling.get(s.kind).independent_event(s, neighboring_relation, inner)
  except errors.UserInputError as e:
    raise errors.UserInputError(f'Round {record.round_num}: {e}') from None


def _multipliers_or_special_event(record: ledger.RoundRecord, neighboring_relation: str):
  """(noise multipliers, None), or (None, event) when the round is non-private or a no-op."""
  check_relation(neighboring_relation)
  multipliers = gaussian_noise_multipliers(record, neighboring_relation)
  if multipliers is None:
    return None, dp_accounting.NonPrivateDpEvent()
  if not multipliers:
    return None, dp_accounting.NoOpDpEvent()
  return multipliers, None


def record_to_dp_event(record: ledger.RoundRecord,
                       neighboring_relation: str = 'add_remove') -> dp_accounting.DpEvent:
  """The DpEvent of one round (Contract 2), with every number a Python float/int.

  Returns `PoissonSampledDpEvent(q, ComposedDpEvent([GaussianDpEvent(sigma_g / Delta_g)...]))`
  (or `SampledWithoutReplacementDpEvent(N, m, ...)` for fixed-size sampling under
  replace-one), `NonPrivateDpEvent` if a query with positive clip had zero noise, and
  `NoOpDpEvent` if no query touched the data.
  """
  multipliers, special = _multipliers_or_special_event(record, neighboring_relation)
  if special is not None:
    return special
  inner = dp_accounting.ComposedDpEvent(
      events=[dp_accounting.GaussianDpEvent(noise_multiplier=z) for z in multipliers])
  return _wrap_sampling(record, neighboring_relation, inner)


def round_down(value: float, digits: int) -> float:
  """Largest float <= value with `digits` significant decimal digits (a PLD group key)."""
  if value == 0.0 or not math.isfinite(value):
    return value
  d = decimal.Decimal(value)  # Exact binary value.
  exponent = d.adjusted() - digits + 1
  rounded = d.quantize(decimal.Decimal(1).scaleb(exponent), rounding=decimal.ROUND_FLOOR)
  # float() rounds to nearest; since value is a float >= rounded, the result is <= value.
  return float(rounded)


def collapsed_dp_event(record: ledger.RoundRecord,
                       neighboring_relation: str = 'add_remove') -> dp_accounting.DpEvent:
  """Like `record_to_dp_event`, with the per-round Gaussians collapsed to one (Eq. (1)).

  Equivalent to `record_to_dp_event`, with the exact z_eff (no rounding). Accepted by both
  RDP and PLD.
  """
  multipliers, special = _multipliers_or_special_event(record, neighboring_relation)
  if special is not None:
    return special
  z = noise_budget.effective_noise_multiplier(multipliers)
  return _wrap_sampling(record, neighboring_relation, dp_accounting.GaussianDpEvent(z))


def with_noise_multiplier(event: dp_accounting.DpEvent, z: float) -> dp_accounting.DpEvent:
  """The collapsed `event` (sampling of one Gaussian) with the Gaussian's multiplier set to z."""
  if isinstance(event, dp_accounting.PoissonSampledDpEvent):
    return dp_accounting.PoissonSampledDpEvent(event.sampling_probability,
                                               dp_accounting.GaussianDpEvent(z))
  return dp_accounting.SampledWithoutReplacementDpEvent(
      event.source_dataset_size, event.sample_size, dp_accounting.GaussianDpEvent(z))
