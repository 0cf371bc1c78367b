"""Privacy-budget formulas of a round's Gaussian queries (pure Python; the one home of each).

With several Gaussian sum queries on the same sample, query g with noise multiplier
z_g = sigma_g / S_g, the round is as private as one Gaussian with (Eq. (1) of McMahan et al.
2018, "A General Approach to Adding Differential Privacy to Iterative Training Procedures")

    z = (sum_g z_g^-2)^-1/2.

Adaptive clipping (Andrew et al.) adds one clipped-count query per adaptive clip: records in
{-1/2, +1/2} (sensitivity 1/2) noised with stddev sigma_b, i.e. multiplier 2 sigma_b. For the
round's effective multiplier to be z, the update queries together get
z_v = (z^-2 - K (2 sigma_b)^-2)^-1/2 (TFF's `adaptive_clip_noise_params` for K = 1), and
group g of G gets z_g = z_v sqrt(G) (proportional) or z_v sqrt(D / d_g) (dimensionality).

Used by the aggregators (to build the queries) and by the accountant and calibration (to
account and calibrate them); they import this module, so the formulas cannot drift apart.
Errors name parameters (`clipped_count_stddev`), never command-line flags.
"""

import math
from typing import Optional, Sequence

from tff_dp import choices
from tff_dp.errors import UserInputError

# How a budget is split over groups of tensors; `group_noise_multipliers` implements each.
NOISE_ALLOCATIONS = tuple(choices.NOISE_ALLOCATIONS)


def default_clipped_count_stddev(clients_per_round: float,
                                 noise_multiplier: float = 0.0) -> float:
  """sigma_b = m / 20, the recommendation of Andrew et al. (and TFF's default), raised to z
  when m / 20 is below it.

  Why the floor: the count query spends part of the round's budget, and with
  sigma_b <= z / 2 it spends all of it (`update_noise_multiplier`): at small cohorts (z = 0.7
  and 5 clients per round) m / 20 made every adaptive run impossible. At sigma_b = z the update
  query's multiplier is z * 2 / sqrt(3) (15% more noise), and m / 20 >= z keeps the paper's value.
  """
  return max(clients_per_round / 20.0, float(noise_multiplier))


def resolve_clipped_count_stddev(clipped_count_stddev: Optional[float],
                                 clients_per_round: float,
                                 noise_multiplier: float = 0.0) -> float:
  """sigma_b as given (checked >= 0), or `default_clipped_count_stddev` when None."""
  if clipped_count_stddev is None:
    return default_clipped_count_stddev(clients_per_round, noise_multiplier)
  if not clipped_count_stddev >= 0 or not math.isfinite(clipped_count_stddev):
    raise UserInputError(f'`clipped_count_stddev` must be a finite number >= 0, got '
                         f'{clipped_count_stddev}')
  return float(clipped_count_stddev)


def update_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float,
                            num_count_queries: int = 1) -> float:
  """Update-query multiplier z_v so that the round's effective multiplier equals z.

  z^-2 = z_v^-2 + K (2 sigma_b)^-2 for K clipped-count queries (K = 1 for flat adaptive
  clipping, one per adaptive group otherwise). z = 0 (no noise anywhere) gives 0. Raises
  UserInputError when the count queries alone spend the budget (z >= 2 sigma_b / sqrt(K)).
  """
  if noise_multiplier == 0:
    return 0.0
  k = int(num_count_queries)
  needed = noise_multiplier * math.sqrt(k) / 2
  if not clipped_count_stddev > needed:
    what = ('the clipped-count query alone' if k == 1 else
            f'the {k} clipped-count queries (one per adaptive clip) alone')
    raise UserInputError(
        f'`noise_multiplier={noise_multiplier:g}` is not achievable with '
        f'`clipped_count_stddev={clipped_count_stddev:g}`: {what} already spend(s) the whole '
        f'budget. Raise `clipped_count_stddev` above {needed:g} (e.g. {2 * needed:g}), lower '
        '`noise_multiplier`, or use a fixed clip (a mechanism without clipped-count queries).')
  return (noise_multiplier**-2 - k * (2 * clipped_count_stddev)**-2)**-0.5


def effective_noise_multiplier(multipliers: Sequence[float]) -> float:
  """Eq. (1): queries with multipliers z_g on the same sample act as one Gaussian with
  z = (sum_g z_g^-2)^-1/2. A zero multiplier (a query without noise) gives 0: no privacy."""
  if any(float(z) == 0 for z in multipliers):
    return 0.0
  return math.fsum(float(z)**-2 for z in multipliers)**-0.5


def group_noise_multipliers(noise_multiplier: float, group_sizes: Sequence[int],
                            allocation: str = 'proportional') -> list[float]:
  """Per-group multipliers z_g = sigma_g / S_g whose Eq. (1) combination equals z.

  proportional (sigma_g = z sqrt(G) S_g) gives z_g = z sqrt(G); dimensionality-adjusted
  (sigma_g = z sqrt(D/d_g) S_g) gives z_g = z sqrt(D/d_g); both satisfy sum z_g^-2 = z^-2.
  """
  check_noise_allocation(allocation)
  num_groups = len(group_sizes)
  if allocation == 'proportional':
    return [noise_multiplier * math.sqrt(num_groups)] * num_groups
  total = float(sum(group_sizes))
  return [noise_multiplier * math.sqrt(total / d) for d in group_sizes]


def check_noise_allocation(allocation: str) -> str:
  if allocation not in NOISE_ALLOCATIONS:
    raise UserInputError(f'noise_allocation must be one of {", ".join(NOISE_ALLOCATIONS)}, '
                         f'got {allocation!r}')
  return allocation
