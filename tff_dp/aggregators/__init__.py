"""DP aggregation factories (genuine `tff.aggregators.UnweightedAggregationFactory`s).

Every factory reports `privacy_queries` (docs/ARCHITECTURE.md, Contract 1) in its measurements.
"""

from typing import Optional

from tff_dp import choices
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

# A program using our aggregators leaves no TFF worker behind, even when it is SIGKILLed.
runtime.bind_workers_to_this_process()


def _fixed(clip, noise, adaptive, noise_allocation, extra):
  del adaptive, noise_allocation, extra   # Checked by build_dp_aggregator: none for fixed.
  return FixedClipGaussianFactory(clip=clip, **noise)


def _adaptive(clip, noise, adaptive, noise_allocation, extra):
  del noise_allocation, extra
  return AdaptiveClipGaussianFactory(initial_clip=clip, **noise, **adaptive)


def _per_layer_adaptive(clip, noise, adaptive, noise_allocation, extra):
  return PerLayerAdaptiveClipFactory(initial_clip=clip, noise_allocation=noise_allocation,
                                     **noise, **adaptive, **extra)


def _joint(clip, noise, adaptive, noise_allocation, extra):
  return JointClipFactory(initial_scale=clip, noise_allocation=noise_allocation, **noise,
                          **adaptive, **extra)


# DP kind -> factory builder (`clip` is the initial clip, or the initial scale alpha for joint).
_FACTORIES = {'fixed': _fixed, 'adaptive': _adaptive, 'per_layer_adaptive': _per_layer_adaptive,
              'joint': _joint}
# Kinds that take extra keyword arguments (`groups`, ...); the others take none.
_TAKE_EXTRA_ARGUMENTS = ('per_layer_adaptive', 'joint')
choices.check_implemented([k for k in choices.DP_KINDS if k != 'none'], _FACTORIES,
                          'tff_dp.aggregators DP kinds')
DP_KINDS = tuple(_FACTORIES)


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
  if kind not in _TAKE_EXTRA_ARGUMENTS and kwargs:
    raise UserInputError(f'DP aggregation kind {kind!r} does not take '
                         f'{", ".join(sorted(kwargs))} (only '
                         f'{" / ".join(_TAKE_EXTRA_ARGUMENTS)} do)')
  noise = dict(noise_multiplier=noise_multiplier, clients_per_round=clients_per_round)
  adaptive = dict(target_unclipped_quantile=target_unclipped_quantile,
                  clip_learning_rate=clip_learning_rate, update_rule=update_rule,
                  clipped_count_stddev=clipped_count_stddev)
  return _FACTORIES[kind](clip, noise, adaptive, noise_allocation, kwargs)
