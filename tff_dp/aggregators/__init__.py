"""DP aggregation factories (genuine `tff.aggregators.UnweightedAggregationFactory`s).

Every factory reports `privacy_queries` (docs/ARCHITECTURE.md, Contract 1) in its measurements.
"""

from typing import Optional

from tff_dp import noise_budget
from tff_dp import runtime
from tff_dp.aggregators.adaptive import AdaptiveClipGaussianFactory
from tff_dp.aggregators.fixed import FixedClipGaussianFactory
from tff_dp.aggregators.fixed import ReportingDPFactory
from tff_dp.aggregators.joint import JointClipFactory
from tff_dp.aggregators.per_layer import PerLayerAdaptiveClipFactory
from tff_dp.aggregators.privacy_queries import MEASUREMENT_KEY
from tff_dp.aggregators.privacy_queries import find_privacy_queries
from tff_dp.errors import UserInputError

DP_KINDS = ('fixed', 'adaptive', 'per_layer_adaptive', 'joint')

# A program using our aggregators leaves no TFF worker behind, even when it is SIGKILLed.
runtime.bind_workers_to_this_process()


def build_dp_aggregator(kind: str, *, noise_multiplier: float, clients_per_round: float,
                        clip: float, target_unclipped_quantile: float = 0.5,
                        clip_learning_rate: float = 0.2, update_rule: str = 'geometric',
                        clipped_count_stddev: Optional[float] = None,
                        noise_allocation: str = 'proportional', **kwargs):
  """The factory for `kind` (`clip` is the initial clip, or initial scale alpha for joint).

  Extra keyword arguments go to the per_layer_adaptive (`groups`) and joint (`groups`,
  `joint_clip`, `adaptive_scales`) factories; anything else is a UserInputError.
  """
  if kind not in DP_KINDS:
    raise UserInputError(f'unknown DP aggregation kind {kind!r}; choose one of '
                         f'{", ".join(DP_KINDS)}')
  noise_budget.check_noise_allocation(noise_allocation)
  if kind in ('fixed', 'adaptive') and kwargs:
    raise UserInputError(f'DP aggregation kind {kind!r} does not take '
                         f'{", ".join(sorted(kwargs))} (only per_layer_adaptive / joint do)')
  if kind == 'fixed':
    return FixedClipGaussianFactory(clip=clip, noise_multiplier=noise_multiplier,
                                    clients_per_round=clients_per_round)
  adaptive = dict(noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
                  target_unclipped_quantile=target_unclipped_quantile,
                  clip_learning_rate=clip_learning_rate, update_rule=update_rule,
                  clipped_count_stddev=clipped_count_stddev)
  if kind == 'adaptive':
    return AdaptiveClipGaussianFactory(initial_clip=clip, **adaptive)
  if kind == 'per_layer_adaptive':
    return PerLayerAdaptiveClipFactory(initial_clip=clip, noise_allocation=noise_allocation,
                                       **adaptive, **kwargs)
  return JointClipFactory(initial_scale=clip, noise_allocation=noise_allocation, **adaptive,
                          **kwargs)
