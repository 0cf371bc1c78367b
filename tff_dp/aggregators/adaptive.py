"""Flat adaptive clipping (Andrew et al.): the clip follows a DP estimate of a norm quantile.

Built on tensorflow_privacy's `QuantileAdaptiveClipSumQuery` (clip, sum, noise and quantile
update in one query), which supports both the geometric and the linear update rule, inside
TFF's `DifferentiallyPrivateFactory`. Unlike TFF's `gaussian_adaptive` we expose the update
rule, validate the budget split with an actionable message, and report the executed privacy
tuples and the estimated unclipped fraction.
"""

import collections

import tensorflow as tf
import tensorflow_privacy as tfp

from tff_dp.aggregators import budget
from tff_dp.aggregators import privacy_queries
from tff_dp.aggregators.fixed import ReportingDPFactory
from tff_dp.errors import UserInputError

UPDATE_RULES = ('geometric', 'linear')


def _quantile_tuples(quantile_state):
  """(S, sigma) of the clipped-count query inside a QuantileEstimatorQuery state."""
  count_state = quantile_state.below_estimate_state.numerator_state
  return privacy_queries.query_tuple(count_state.l2_norm_clip, count_state.stddev)


class AdaptiveClipGaussianFactory(ReportingDPFactory):
  """Flat adaptive clipping with an explicit privacy budget split.

  `noise_multiplier` is the effective z of the whole round; the update query gets
  z_v = (z^-2 - (2 sigma_b)^-2)^-1/2 and the clipped-count query stddev sigma_b.
  """

  def __init__(self, *, noise_multiplier: float, clients_per_round: float,
               initial_clip: float, target_unclipped_quantile: float = 0.5,
               clip_learning_rate: float = 0.2, update_rule: str = 'geometric',
               clipped_count_stddev: float | None = None):
    if update_rule not in UPDATE_RULES:
      raise UserInputError(f'update rule must be geometric or linear, got {update_rule!r}')
    if not 0 < target_unclipped_quantile < 1:
      raise UserInputError('target_unclipped_quantile must be in (0, 1), got '
                           f'{target_unclipped_quantile}')
    if not initial_clip > 0:
      raise UserInputError(f'initial clip must be positive, got {initial_clip}')
    if not clip_learning_rate > 0:
      raise UserInputError(f'clip_learning_rate must be positive, got {clip_learning_rate}')
    if not clients_per_round > 0:
      raise UserInputError(f'clients_per_round must be positive, got {clients_per_round}')
    if not noise_multiplier >= 0:
      raise UserInputError(f'noise_multiplier must be >= 0, got {noise_multiplier}')
    self.noise_multiplier = float(noise_multiplier)
    self.clipped_count_stddev = budget.resolve_clipped_count_stddev(
        clipped_count_stddev, clients_per_round)
    if self.noise_multiplier == 0 and clipped_count_stddev is None:
      self.clipped_count_stddev = 0.0   # No noise anywhere (as TFF's gaussian_adaptive).
    self.update_noise_multiplier = budget.update_noise_multiplier(
        self.noise_multiplier, self.clipped_count_stddev)
    self.update_rule = update_rule
    query = tfp.NormalizedQuery(
        tfp.QuantileAdaptiveClipSumQuery(
            initial_l2_norm_clip=float(initial_clip),
            noise_multiplier=self.update_noise_multiplier,
            target_unclipped_quantile=float(target_unclipped_quantile),
            learning_rate=float(clip_learning_rate),
            clipped_count_stddev=self.clipped_count_stddev,
            expected_num_records=float(clients_per_round),
            geometric_update=update_rule == 'geometric'),
        denominator=float(clients_per_round))

    def tuples(query_state):
      state = query_state.numerator_state
      return collections.OrderedDict(
          update=privacy_queries.query_tuple(state.sum_state.l2_norm_clip,
                                             state.sum_state.stddev),
          clipped_count=_quantile_tuples(state.quantile_estimator_state))

    geometric = update_rule == 'geometric'
    gamma = float(target_unclipped_quantile)
    eta = float(clip_learning_rate)

    def metrics(query_state, inner_measurements):
      clip_used = query_state.numerator_state.sum_state.l2_norm_clip
      next_clip = inner_measurements['dp_query_metrics']['clip']
      # The noised unclipped fraction b is not kept in state; invert the clip update to
      # report it (exact: b is clamped to [0, 1] before the update is applied).
      if geometric:
        fraction = gamma - tf.math.log(next_clip / clip_used) / eta
      else:
        fraction = gamma + (clip_used - next_clip) / eta
      return collections.OrderedDict(
          clip=clip_used, next_clip=next_clip, unclipped_fraction_estimate=fraction)

    super().__init__(query, tuples, metrics)
