"""DP aggregation factories (genuine `tff.aggregators.UnweightedAggregationFactory`s).

Every factory reports `privacy_queries` (docs/ARCHITECTURE.md, Contract 1) in its measurements.
"""

from typing import Optional

from tff_dp import noise_budget
from tff_dp import runtime
from tff_dp.aggregators.adaptive import AdaptiveClipGaussianFactory
from tff_dp.aggregators.fixed import FixedClipGaussianFactory
from tff_dp.aggregators.fixed import ReportingDPFactory
from tff_dp.aggregators.ftrl import FtrlFactory
from tff_dp.aggregators.ftrl_adaptive import FtrlAdaptiveFactory
from tff_dp.aggregators.joint import JointClipFactory
from tff_dp.aggregators.per_layer import PerLayerAdaptiveClipFactory
from tff_dp.aggregators.privacy_queries import MEASUREMENT_KEY
from tff_dp.aggregators.privacy_queries import find_privacy_queries
from tff_dp.aggregators.privacy_queries import find_tree_leaf
from tff_dp.errors import UserInputError

DP_KINDS = ('fixed', 'adaptive', 'per_layer_adaptive', 'joint', 'ftrl', 'ftrl_adaptive')
# The kinds whose noise is tree aggregation (DP-FTRL): accounted per epoch of shuffled
# participation under replace-special neighbouring (tff_dp.accounting).
TREE_KINDS = ('ftrl', 'ftrl_adaptive')
_TREE_OPTIONS = {'ftrl': ('rounds_per_epoch', 'noise_seed'),
                 'ftrl_adaptive': ('rounds_per_epoch', 'noise_seed', 'restart_warmup',
                                   'restart_frequency')}

# A program using our aggregators leaves no TFF worker behind, even when it is SIGKILLed.
runtime.bind_workers_to_this_process()


def build_dp_aggregator(kind: str, *, noise_multiplier: float, clients_per_round: float,
                        clip: float, target_unclipped_quantile: float = 0.5,
                        clip_learning_rate: float = 0.2, update_rule: str = 'geometric',
                        clipped_count_stddev: Optional[float] = None,
                        noise_allocation: str = 'proportional', **kwargs):
  """The factory for `kind` (`clip` is the initial clip, or initial scale alpha for joint).

  Extra keyword arguments go to the per_layer_adaptive (`groups`) and joint (`groups`,
  `joint_clip`, `adaptive_scales`) factories, and to the tree factories (`rounds_per_epoch`,
  `noise_seed`; ftrl_adaptive also `restart_warmup`, `restart_frequency`); anything else is a
  UserInputError. The tree factories use neither `update_rule` (geometric, as TFF) nor
  `noise_allocation`.
  """
  if kind not in DP_KINDS:
    raise UserInputError(f'unknown DP aggregation kind {kind!r}; choose one of '
                         f'{", ".join(DP_KINDS)}')
  noise_budget.check_noise_allocation(noise_allocation)
  if kind in TREE_KINDS:
    unknown = sorted(set(kwargs) - set(_TREE_OPTIONS[kind]))
    if unknown:
      raise UserInputError(f'DP aggregation kind {kind!r} does not take {", ".join(unknown)}')
    if kind == 'ftrl':
      return FtrlFactory(clip=clip, noise_multiplier=noise_multiplier,
                         clients_per_round=clients_per_round, **kwargs)
    if update_rule != 'geometric':
      raise UserInputError("DP aggregation kind 'ftrl_adaptive' adapts its clip geometrically "
                           f'(as TFF), got update rule {update_rule!r}')
    return FtrlAdaptiveFactory(
        noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
        initial_clip=clip, target_unclipped_quantile=target_unclipped_quantile,
        clip_learning_rate=clip_learning_rate, clipped_count_stddev=clipped_count_stddev,
        **kwargs)
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
