"""Privacy-budget formulas (pure Python): adaptive-clipping split and Eq. (1) of the ledger paper."""

import math
from typing import Optional, Sequence

from tff_dp.errors import UserInputError


def default_clipped_count_stddev(clients_per_round: float) -> float:
  """sigma_b = m / 20, the recommendation of Andrew et al. (and TFF's default)."""
  return clients_per_round / 20.0


def update_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float,
                            num_count_queries: int = 1) -> float:
  """Value noise multiplier z_v so that the round's effective multiplier equals z.

  Each clipped-count query has sensitivity 1/2 and stddev sigma_b, i.e. multiplier 2*sigma_b;
  composing Gaussians adds inverse squares (Eq. (1)): z^-2 = z_v^-2 + K (2 sigma_b)^-2 for K
  count queries (K = 1 for flat adaptive clipping, one per adaptive group otherwise).
  """
  if noise_multiplier == 0:
    return 0.0
  k = int(num_count_queries)
  needed = noise_multiplier * math.sqrt(k) / 2
  if clipped_count_stddev <= 0 or clipped_count_stddev <= needed:
    what = ('the clipped-count query alone' if k == 1 else
            f'the {k} clipped-count queries (one per adaptive clip) alone')
    raise UserInputError(
        f'noise_multiplier={noise_multiplier:g} is not achievable with clipped_count_stddev='
        f'{clipped_count_stddev:g}: {what} already spend(s) the whole budget. Raise '
        f'--clipped_count_stddev above {needed:g} (e.g. {2 * needed:g}) or lower '
        '--noise_multiplier, or use --dp=fixed.')
  return (noise_multiplier**-2 - k * (2 * clipped_count_stddev)**-2)**-0.5


def effective_noise_multiplier(multipliers: Sequence[float]) -> float:
  """Eq. (1): groups with multipliers z_g = sigma_g / S_g act as one query with
  z = (sum_g z_g^-2)^-1/2 (a zero multiplier means no privacy: returns 0)."""
  if any(z == 0 for z in multipliers):
    return 0.0
  return sum(float(z)**-2 for z in multipliers)**-0.5


def group_noise_multipliers(noise_multiplier: float, group_sizes: Sequence[int],
                            allocation: str = 'proportional') -> list[float]:
  """Per-group multipliers z_g = sigma_g / S_g whose Eq. (1) combination equals z.

  proportional (sigma_g = z sqrt(G) S_g) gives z_g = z sqrt(G); dimensionality-adjusted
  (sigma_g = z sqrt(D/d_g) S_g) gives z_g = z sqrt(D/d_g); both satisfy sum z_g^-2 = z^-2.
  """
  num_groups = len(group_sizes)
  if allocation == 'proportional':
    return [noise_multiplier * math.sqrt(num_groups)] * num_groups
  if allocation == 'dimensionality':
    total = float(sum(group_sizes))
    return [noise_multiplier * math.sqrt(total / d) for d in group_sizes]
  raise UserInputError(f'unknown noise allocation {allocation!r}: use proportional or '
                       'dimensionality')


def resolve_clipped_count_stddev(clipped_count_stddev: Optional[float],
                                 clients_per_round: float) -> float:
  if clipped_count_stddev is None:
    return default_clipped_count_stddev(clients_per_round)
  if clipped_count_stddev < 0:
    raise UserInputError(f'clipped_count_stddev must be >= 0, got {clipped_count_stddev}')
  return float(clipped_count_stddev)
