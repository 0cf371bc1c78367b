"""Noise calibration: the effective noise multiplier z meeting (epsilon, delta) over T rounds.

z is the noise multiplier of the single Gaussian that is equivalent (Eq. (1) of McMahan &
Andrew 2018) to all queries of a round; it is what TFF's `gaussian_adaptive` /
`gaussian_fixed` take as `noise_multiplier`. With adaptive clipping the clipped-count query
(records in {-0.5, +0.5}, so sensitivity 0.5, noise stddev sigma_b, i.e. noise multiplier
2 sigma_b) spends part of the budget, so the update query gets the larger multiplier

    z_v = (z^-2 - (2 sigma_b)^-2)^-1/2

(TFF `differential_privacy.adaptive_clip_noise_params`), which needs z < 2 sigma_b.
The search is dp_accounting's `calibrate_dp_mechanism` (Brent's method) on an explicit
bracket we find first, on the same per-round event the ledger accountant composes.

`mechanism='tree'` (DP-FTRL, shuffled participation, replace-special neighbouring): z is the
per-node multiplier of the tree noise; the event is one `SingleEpochTreeAggregationDpEvent(z,
steps)` per epoch of `sampling.rounds_per_epoch(N, m)` rounds (the last one partial), composed,
as the ledger accountant composes the executed rounds when the tree restarts only at epoch
boundaries. Restarts inside an epoch (ftrl_adaptive's warm-up and frequency) make smaller trees
and can only lower epsilon, so the z calibrated here is valid for them too (slightly
conservative when they shorten the epoch's largest tree below its depth).
"""

import dataclasses
import math
from typing import Optional

import dp_accounting

from tff_dp import choices
from tff_dp import errors
from tff_dp import ledger
from tff_dp import noise_budget
from tff_dp import sampling as sampling_lib
from tff_dp.accounting import accountant
from tff_dp.accounting import claims
from tff_dp.accounting import noise_families
from tff_dp.accounting import events

MECHANISMS = ('gaussian', 'tree')

_Z_MIN, _Z_MAX = 1e-3, 1e3  # Outside this range the setting is useless in practice.


def update_noise_multiplier(noise_multiplier: float,
                            clipped_count_stddev: Optional[float]) -> float:
  """The update query's multiplier z_v given the effective z and sigma_b (None: fixed clip, z).

  The split itself is `noise_budget.update_noise_multiplier`, the one the aggregators use."""
  if clipped_count_stddev is None:
    return float(noise_multiplier)
  sigma_b = noise_budget.resolve_clipped_count_stddev(clipped_count_stddev, 0.0)
  return noise_budget.update_noise_multiplier(float(noise_multiplier), sigma_b)


@dataclasses.dataclass(frozen=True)
class CalibrationResult:
  """Calibrated noise: effective z, update-query z_v, and the epsilon z actually achieves."""
  noise_multiplier: float
  update_noise_multiplier: float
  clipped_count_stddev: Optional[float]
  epsilon: float
  delta: float
  rounds: int
  sampling: ledger.SamplingEvent
  method: str
  neighboring_relation: str


def _independent_samplers() -> list[str]:
  """The samplers independent noise is analysed with (their declarations' DpEvent)."""
  return [name for name, kind in sampling_lib.KINDS.items() if kind.independent_event]


def _sampling_event(sampling_probability, population_size, clients_per_round,
                    sampling) -> ledger.SamplingEvent:
  """The event the `sampling` sampler records for a round of `clients_per_round` from
  `population_size` (or at rate `sampling_probability`, for a sampler with a rate)."""
  declared = sampling_lib.get(sampling)
  if declared.independent_event is None:
    raise errors.UserInputError(f'`sampling` must be one of '
                                f'{choices.one_of(_independent_samplers())}, got {sampling!r}.')
  if sampling_probability is None or not declared.with_rate:
    if population_size is None or clients_per_round is None:
      raise errors.UserInputError(
          f'{declared.title} sampling needs population_size and clients_per_round'
          + (', or sampling_probability.' if declared.with_rate else '.'))
    if clients_per_round > population_size:
      raise errors.UserInputError(f'clients_per_round ({clients_per_round}) exceeds '
                                  f'population_size ({population_size}).')
  try:   # The sampler's own event (a population of ids 0..N-1: the event depends on N only).
    return sampling_lib.build_sampler(sampling, range(population_size or 1),
                                      clients_per_round or 1,
                                      probability=sampling_probability).sampling_event(1)
  except ledger.LedgerError as e:
    raise errors.UserInputError(str(e)) from None


def calibrate_noise_multiplier(
    target_epsilon: float, delta: float, rounds: int, *,
    sampling_probability: Optional[float] = None,
    population_size: Optional[int] = None,
    clients_per_round: Optional[int] = None,
    clipped_count_stddev: Optional[float] = None,
    sampling: str = 'poisson',
    neighboring_relation: Optional[str] = None,
    method: str = 'rdp',
    mechanism: str = 'gaussian',
    tol: float = 1e-5) -> CalibrationResult:
  """Smallest effective noise multiplier z (within tol) with epsilon(z) <= target_epsilon.

  Give `sampling_probability` q, or `population_size` N and `clients_per_round` m (q = m/N).
  `clipped_count_stddev` (sigma_b, adaptive clipping) only changes the reported update
  multiplier, never z: the round's accounting depends only on z (Eq. (1)).
  `mechanism='tree'` (module docstring) needs `population_size` and `clients_per_round`,
  ignores `sampling` (shuffled) and is accounted under 'replace_special' (the default relation
  for it; 'add_remove' is the default otherwise).
  Raises UserInputError for impossible settings.
  """
  try:
    target_epsilon = float(target_epsilon)
  except (TypeError, ValueError):
    raise errors.UserInputError(f'target_epsilon must be a number, got {target_epsilon!r}.')
  if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
    raise errors.UserInputError(f'target_epsilon must be positive and finite, got '
                                f'{target_epsilon}.')
  delta = accountant.check_delta(
      delta, population_size if isinstance(population_size, int) and population_size > 0
      else None)
  if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
    raise errors.UserInputError(f'rounds must be a positive integer, got {rounds!r}.')
  if method not in accountant.METHODS:
    raise errors.UserInputError(f'`method` must be one of {accountant.METHODS}, got {method!r}.')
  if mechanism not in MECHANISMS:
    raise errors.UserInputError(f'`mechanism` must be one of {MECHANISMS}, got {mechanism!r}.')
  if mechanism == 'tree':
    return _calibrate_tree(target_epsilon, delta, rounds, population_size, clients_per_round,
                           clipped_count_stddev, neighboring_relation, method, tol)
  event = _sampling_event(sampling_probability, population_size, clients_per_round, sampling)
  if neighboring_relation is None:   # The claim's: zero-out when q is derived from N.
    neighboring_relation = claims.claim(noise_families.INDEPENDENT.name, sampling,
                                        event.probability_given).columns_relation
  accountant.check_relation(neighboring_relation)
  relation = events.dp_accounting_relation(neighboring_relation, sampled=True)
  proven = list(dict.fromkeys(   # The samplers whose rows (or their columns) use it.
      c.sampler for c in claims.CLAIMS if c.noise == noise_families.INDEPENDENT.name
      and neighboring_relation in (c.relation, c.columns_relation)))
  if sampling not in proven:
    raise errors.UserInputError(
        f'neighboring_relation {neighboring_relation!r} is analysed for '
        f'{choices.one_of(proven)} sampling only; use `sampling={proven[0]}`.' if proven else
        f'neighboring_relation {neighboring_relation!r} has no analysis of independent noise.')

  def make_event(z: float) -> dp_accounting.DpEvent:
    # One round with a single query of clip 1 and stddev z, mapped exactly as the ledger
    # accountant maps real rounds.
    record = ledger.RoundRecord(0, event, (ledger.GaussianSumQuery('z', 1.0, float(z)),))
    per_round = accountant.collapsed_dp_event(record, neighboring_relation)
    return dp_accounting.SelfComposedDpEvent(per_round, rounds)

  def make_accountant():
    if method == 'rdp':
      return dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    return dp_accounting.pld.PLDAccountant(neighboring_relation=relation)

  probe = make_accountant()
  if not probe.supports(make_event(1.0)):
    raise errors.UserInputError(
        f'{method} cannot analyse {sampling} sampling under {neighboring_relation}.')

  return _search(make_accountant, make_event, target_epsilon, delta, rounds, tol,
                 clipped_count_stddev, event, method, neighboring_relation)


def _calibrate_tree(target_epsilon, delta, rounds, population_size, clients_per_round,
                    clipped_count_stddev, neighboring_relation, method, tol):
  if neighboring_relation not in (None, accountant.TREE_RELATION):
    raise errors.UserInputError(
        f'tree aggregation is accounted under {accountant.TREE_RELATION} only, got '
        f'{neighboring_relation!r}.')
  if method != 'rdp':
    raise errors.UserInputError('PLD cannot analyse tree aggregation (DP-FTRL); use rdp.')
  if population_size is None or clients_per_round is None:
    raise errors.UserInputError('tree calibration needs population_size and '
                                'clients_per_round (the epochs of shuffled participation).')
  try:
    event = ledger.SamplingEvent('shuffled', population_size, sample_size=clients_per_round,
                                 epoch=1)
  except ledger.LedgerError as e:
    raise errors.UserInputError(str(e)) from None
  per_epoch = sampling_lib.rounds_per_epoch(population_size, clients_per_round)
  full, rest = divmod(rounds, per_epoch)
  epoch_steps = [per_epoch] * full + ([rest] if rest else [])

  def make_event(z: float) -> dp_accounting.DpEvent:
    return dp_accounting.ComposedDpEvent(
        [dp_accounting.SingleEpochTreeAggregationDpEvent(float(z), steps)
         for steps in epoch_steps])

  def make_accountant():
    return dp_accounting.rdp.RdpAccountant(neighboring_relation=accountant.NEIGHBORING_RELATIONS[
        accountant.TREE_RELATION])

  return _search(make_accountant, make_event, target_epsilon, delta, rounds, tol,
                 clipped_count_stddev, event, method, accountant.TREE_RELATION)


def _search(make_accountant, make_event, target_epsilon, delta, rounds, tol,
            clipped_count_stddev, event, method, neighboring_relation) -> CalibrationResult:
  """Smallest z (within tol) with epsilon <= target for the event family `make_event`."""

  def eps(z: float) -> float:
    return make_accountant().compose(make_event(z)).get_epsilon(delta)

  # Explicit bracket [lo, hi] with eps(lo) > target >= eps(hi) (epsilon decreases in z).
  lo, hi = 0.5, 1.0
  while eps(hi) > target_epsilon:
    lo, hi = hi, hi * 2
    if hi > _Z_MAX:
      raise errors.UserInputError(
          f'target_epsilon={target_epsilon} is unreachable with noise multiplier <= '
          f'{_Z_MAX:g} for {rounds} rounds at this sampling rate; relax the target, run '
          'fewer rounds or sample fewer clients per round.')
  while eps(lo) <= target_epsilon:
    lo, hi = lo / 2, lo
    if lo < _Z_MIN:
      raise errors.UserInputError(
          f'target_epsilon={target_epsilon} is reached with almost no noise (z < {_Z_MIN:g}); '
          'the target is too loose to calibrate meaningfully.')
  z = dp_accounting.calibrate_dp_mechanism(
      make_accountant, make_event, target_epsilon, delta,
      bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi), tol=tol)
  z = float(z)
  return CalibrationResult(
      noise_multiplier=z,
      update_noise_multiplier=update_noise_multiplier(z, clipped_count_stddev),
      clipped_count_stddev=(None if clipped_count_stddev is None
                            else float(clipped_count_stddev)),
      epsilon=float(eps(z)), delta=delta, rounds=rounds, sampling=event, method=method,
      neighboring_relation=neighboring_relation)
