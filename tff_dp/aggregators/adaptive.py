"""Flat adaptive clipping (Andrew et al.): the clip follows a DP estimate of a norm quantile.

Built on tensorflow_privacy's `QuantileAdaptiveClipSumQuery` (clip, sum, noise and quantile
update in one query), which supports both the geometric and the linear update rule, inside
TFF's `DifferentiallyPrivateFactory`. Unlike TFF's `gaussian_adaptive` we expose the update
rule, validate the budget split with an actionable message, report the executed privacy
tuples and the estimated unclipped fraction, and keep the clip >= `estimate_floor.MIN_ESTIMATE`
(tfp clamps it at 0, where clipping a zero update is NaN; above the floor we equal
`gaussian_adaptive` bit for bit).
"""

import collections

import tensorflow_privacy as tfp

from tff_dp import noise_budget
from tff_dp.aggregators import estimate_floor
from tff_dp.aggregators import privacy_queries
from tff_dp import adaptive_clipping
from tff_dp.aggregators import quantile_clipping
from tff_dp.aggregators.reporting import ReportingDPFactory


def _quantile_tuples(quantile_state):
  """(S, sigma) of the clipped-count query inside a QuantileEstimatorQuery state."""
  count_state = quantile_state.below_estimate_state.numerator_state
  return privacy_queries.query_tuple(count_state.l2_norm_clip, count_state.stddev)


_DEFAULT = adaptive_clipping.AdaptiveClipping()


class AdaptiveClipGaussianFactory(ReportingDPFactory):
  """Flat adaptive clipping with an explicit privacy budget split.

  `noise_multiplier` is the effective z of the whole round; the update query gets
  z_v = (z^-2 - (2 sigma_b)^-2)^-1/2 and the clipped-count query stddev sigma_b.
  Measurements: privacy_queries {update, clipped_count}, clip (used this round), next_clip,
  unclipped_fraction_estimate (the noised b of this round; it understates b in a round where
  the MIN_ESTIMATE floor binds), plus TFF's dp_query_metrics / dp.
  """

  def __init__(self, *, noise_multiplier: float, clients_per_round: float,
               initial_clip: float,
               adaptive: adaptive_clipping.AdaptiveClipping = _DEFAULT):
    quantile_clipping.check_adaptive_args(
        noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
        initial_clip=initial_clip)
    self.adaptive = adaptive
    self.noise_multiplier = float(noise_multiplier)
    self.clipped_count_stddev = quantile_clipping.resolve_count_stddev(
        self.noise_multiplier, adaptive.clipped_count_stddev, clients_per_round)
    self.update_noise_multiplier = noise_budget.update_noise_multiplier(
        self.noise_multiplier, self.clipped_count_stddev)
    query = tfp.NormalizedQuery(
        estimate_floor.FlooredQuantileAdaptiveClipSumQuery(
            initial_l2_norm_clip=float(initial_clip),
            noise_multiplier=self.update_noise_multiplier,
            target_unclipped_quantile=float(adaptive.target_unclipped_quantile),
            learning_rate=float(adaptive.clip_learning_rate),
            clipped_count_stddev=self.clipped_count_stddev,
            expected_num_records=float(clients_per_round),
            geometric_update=adaptive.geometric),
        denominator=float(clients_per_round))

    def tuples(query_state):
      state = query_state.numerator_state
      return collections.OrderedDict(
          update=privacy_queries.query_tuple(state.sum_state.l2_norm_clip,
                                             state.sum_state.stddev),
          clipped_count=_quantile_tuples(state.quantile_estimator_state))

    geometric = adaptive.geometric
    gamma = float(adaptive.target_unclipped_quantile)
    eta = float(adaptive.clip_learning_rate)

    def metrics(query_state, inner_measurements):
      clip_used = query_state.numerator_state.sum_state.l2_norm_clip
      next_clip = inner_measurements['dp_query_metrics']['clip']
      fraction = quantile_clipping.unclipped_fraction(clip_used, next_clip, gamma, eta, geometric)
      return collections.OrderedDict(
          clip=clip_used, next_clip=next_clip, unclipped_fraction_estimate=fraction)

    super().__init__(query, tuples, metrics,
                     extra_measurements=quantile_clipping.ADAPTIVE_CLIP_MEASUREMENTS)
