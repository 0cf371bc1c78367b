"""Fixed-clip Gaussian DP aggregation that reports its executed privacy tuple each round."""

import collections

import tensorflow_privacy as tfp

from tff_dp.aggregators import privacy_queries
from tff_dp.aggregators.reporting import ReportingDPFactory
from tff_dp.errors import UserInputError


def check_fixed_args(clip, noise_multiplier, clients_per_round) -> None:
  """UserInputError for a fixed clip, noise multiplier or cohort size out of range."""
  if not clip > 0:
    raise UserInputError(f'`clip` must be positive, got {clip}')
  if not noise_multiplier >= 0:
    raise UserInputError(f'`noise_multiplier` must be >= 0, got {noise_multiplier}')
  if not clients_per_round > 0:
    raise UserInputError(f'`clients_per_round` must be positive, got {clients_per_round}')


class FixedClipGaussianFactory(ReportingDPFactory):
  """Flat fixed clipping: clip each client update to L2 norm `clip`, add N(0, (z*clip)^2).

  Equivalent to `tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed` (same tfp query:
  `NormalizedQuery(GaussianSumQuery(clip, z*clip), clients_per_round)`).
  """

  def __init__(self, clip: float, noise_multiplier: float, clients_per_round: float):
    check_fixed_args(clip, noise_multiplier, clients_per_round)
    self.clip = float(clip)
    self.noise_multiplier = float(noise_multiplier)
    query = tfp.NormalizedQuery(
        tfp.GaussianSumQuery(l2_norm_clip=self.clip, stddev=self.clip * self.noise_multiplier),
        denominator=float(clients_per_round))

    def tuples(query_state):
      sum_state = query_state.numerator_state
      return collections.OrderedDict(update=privacy_queries.query_tuple(
          sum_state.l2_norm_clip, sum_state.stddev))

    super().__init__(query, tuples)
