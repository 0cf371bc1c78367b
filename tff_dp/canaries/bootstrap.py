"""How much K canaries say: a percentile-bootstrap confidence interval of a canary estimate
(`estimate`), and, when it is too wide to mean anything, how many canaries would halve it."""

import dataclasses
import math
from typing import Any, Optional

import numpy as np

from tff_dp.canaries import estimate
from tff_dp.errors import UserInputError


@dataclasses.dataclass(frozen=True)
class EstimateInterval:
  """A percentile-bootstrap confidence interval of a canary estimate, and whether K canaries
  say anything.

  Attributes:
    low, high: the interval's ends (epsilon at the estimate's delta).
    confidence: its nominal coverage (e.g. 0.95).
    too_few_canaries: None when the interval excludes 0 and its half-width is at most half the
      estimate; otherwise why not, with the number of canaries that would get there (the
      width shrinks as 1/sqrt(K)).
  """
  low: float
  high: float
  confidence: float
  too_few_canaries: Optional[str]


def bootstrap_interval(inserted: Any, delta: float, *, unseen: Any = None,
                       null: Optional[tuple[float, float]] = None, confidence: float = 0.95,
                       resamples: int = 200, seed: int = 0) -> EstimateInterval:
  """Confidence interval of the estimate from `inserted` statistics against a fitted null
  (`unseen` statistics, resampled too) or a fixed one (`null` = (mean, std), e.g. the
  closed-form N(0, 1/d)): the `confidence` percentile interval of the estimate over
  `resamples` resamplings of the canaries with replacement (seeded: the same statistics give
  the same interval).

  Why: at small K the fitted std carries a relative error ~ 1/sqrt(2K), and any mismatch with
  the null raises epsilon, so a point estimate alone overstates what K canaries show (K = 20
  with no signal at all gives a median estimate of ~3).
  """
  inserted = estimate.statistics(inserted, 'inserted')
  if (unseen is None) == (null is None):
    raise UserInputError('give `unseen` statistics or a closed-form `null`, not both')
  unseen = None if unseen is None else estimate.statistics(unseen, 'unseen')
  delta = estimate.check_delta(delta)
  rng = np.random.default_rng(seed)

  def epsilon_of(sample: np.ndarray, null_sample: Optional[np.ndarray]) -> float:
    null_mu, null_sigma = null if null_sample is None else estimate.fit(null_sample)
    return estimate.gaussian_pair_epsilon(null_mu, null_sigma, *estimate.fit(sample), delta)

  point = epsilon_of(inserted, unseen)
  values = np.array([
      epsilon_of(rng.choice(inserted, inserted.size),
                 None if unseen is None else rng.choice(unseen, unseen.size))
      for _ in range(resamples)])
  tail = (1.0 - confidence) / 2.0
  # The estimates are in [0, inf] (inf: a resample whose canaries all hold one value fits
  # sigma = 0). np.quantile interpolates between neighbours and gives NaN between two infinite
  # ones, where the percentile is infinite.
  with np.errstate(invalid='ignore'):
    ends = np.quantile(values, [tail, 1.0 - tail])
  low, high = (math.inf if math.isnan(v) else float(v) for v in ends)
  return EstimateInterval(low, high, confidence,
                          _too_few(point, low, high, inserted.size, confidence))


def _too_few(point: float, low: float, high: float, k: int, confidence: float) -> Optional[str]:
  half_width = (high - low) / 2.0
  if low > 0.0 and half_width <= 0.5 * point:
    return None
  if not math.isfinite(half_width):
    return f'the {confidence:.0%} interval is unbounded with K = {k}'
  if point <= 0.0:
    return (f'no signal: the estimate is 0, consistent with no privacy loss, at K = {k}')
  needed = math.ceil(k * (half_width / (0.5 * point)) ** 2)
  reason = ('the interval includes 0' if low <= 0.0 else
            f'the interval is +-{half_width:.3g} around {point:.3g}')
  return f'{reason} at K = {k}; about K = {max(needed, k + 1)} canaries would halve it'
