"""The delta a guarantee is stated at: checked against the population (one home)."""

import math
from typing import Optional

from tff_dp import errors


def check_delta(delta, population_size: Optional[int] = None) -> float:
  """`delta` as a float in (0, 1), and below 1 / `population_size` when that is given.

  A delta at or above 1/N is no user-level guarantee: the mechanism that publishes one
  randomly chosen client's data in the clear satisfies (0, 1/N)-DP. So a run, a ledger
  replay and a calibration over N clients refuse it and name a delta that works.
  """
  try:
    delta = float(delta)
  except (TypeError, ValueError):
    raise errors.UserInputError(f'`delta` must be a number, got {delta!r}.') from None
  if not 0.0 < delta < 1.0:
    raise errors.UserInputError(f'`delta` must be in (0, 1), got {delta}.')
  if population_size is not None and delta * population_size >= 1.0:
    raise errors.UserInputError(
        f'`delta={delta:g}` is not below 1/population = 1/{population_size}: publishing one '
        f'random client\'s data in the clear would satisfy it; use `delta` <= '
        f'{suggested_delta(population_size):g}.')
  return delta


def suggested_delta(population_size: int) -> float:
  """A delta well below 1/population (a power of ten at most 1/(10 N)), and at most 1e-5: the
  default of runs and the value `check_delta` suggests."""
  return min(1e-5, 10 ** math.floor(math.log10(1.0 / population_size) - 1))
