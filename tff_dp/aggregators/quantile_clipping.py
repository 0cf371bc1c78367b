"""What the quantile-estimated (adaptive) clips of flat, per-layer and joint clipping share.

Andrew et al.'s clip update: the clip follows a DP estimate of the `target_unclipped_quantile`
gamma of the update norms, by a geometric (C <- C exp(-eta (b - gamma))) or linear
(C <- C - eta (b - gamma)) step on the noised unclipped fraction b. Here: the rules, the argument
checks, the default clipped-count noise, and b recovered from two clips.
"""

import tensorflow as tf

from tff_dp import measurements
from tff_dp import noise_budget
from tff_dp.errors import UserInputError


def check_adaptive_args(*, noise_multiplier, clients_per_round, initial_clip):
  """UserInputError for out-of-range settings of an adaptive factory (its `AdaptiveClipping`
  checked itself)."""
  if not initial_clip > 0:
    raise UserInputError(f'initial clip must be positive, got {initial_clip}')
  if not clients_per_round > 0:
    raise UserInputError(f'clients_per_round must be positive, got {clients_per_round}')
  if not noise_multiplier >= 0:
    raise UserInputError(f'noise_multiplier must be >= 0, got {noise_multiplier}')


def resolve_count_stddev(noise_multiplier, clipped_count_stddev, clients_per_round):
  """sigma_b: given, else max(m/20, z) with noise, else 0 (no noise anywhere, as TFF)."""
  if noise_multiplier == 0 and clipped_count_stddev is None:
    return 0.0
  return noise_budget.resolve_clipped_count_stddev(clipped_count_stddev, clients_per_round,
                                                   noise_multiplier)


# What an adaptive clip's factory reports beside its privacy queries (per group when it clips
# per group).
CLIP = measurements.Measurement('clip', 'the L2 clip the round used', covered=True)
UNCLIPPED_FRACTION = measurements.Measurement(
    'unclipped_fraction_estimate', 'the noised fraction of unclipped updates the quantile '
    'update used (`unclipped_fraction`)', covered=True)
ADAPTIVE_CLIP_MEASUREMENTS = (
    CLIP, measurements.Measurement('next_clip', 'the L2 clip of the next round', covered=True),
    UNCLIPPED_FRACTION)


def unclipped_fraction(clip_used, next_clip, gamma, eta, geometric):
  """The noised unclipped fraction b, recovered by inverting the clip update (it is not kept in
  tfp's state). Exact (b is clamped to [0, 1] before the update) unless the step was clamped:
  in a round where the estimate_floor.MIN_ESTIMATE floor binds, next_clip is above the
  unclamped step, so the result understates b (it can fall below 0)."""
  if geometric:
    return gamma - tf.math.log(next_clip / clip_used) / eta
  return gamma + (clip_used - next_clip) / eta
