"""DP aggregation factories (genuine `tff.aggregators.UnweightedAggregationFactory`s).

Every factory reports `privacy_queries` (docs/ARCHITECTURE.md, Contract 1) in its measurements.
"""


from tff_dp import choices
from tff_dp import noise_budget
from tff_dp.aggregators.adaptive import AdaptiveClipGaussianFactory
from tff_dp.aggregators.correlated_noise import CorrelatedNoiseFactory
from tff_dp.aggregators.fixed import FixedClipGaussianFactory
from tff_dp.aggregators.reporting import ReportingDPFactory
from tff_dp.aggregators.ftrl import FtrlFactory
from tff_dp.aggregators.ftrl_adaptive import FtrlAdaptiveFactory
from tff_dp.aggregators.joint import JointClipFactory
from tff_dp.aggregators.per_layer import PerLayerAdaptiveClipFactory
from tff_dp.aggregators.privacy_queries import MEASUREMENT_KEY
from tff_dp.aggregators.privacy_queries import find_privacy_queries
from tff_dp.aggregators.privacy_queries import find_tree_leaf
from tff_dp.adaptive_clipping import AdaptiveClipping
from tff_dp.errors import UserInputError


def _fixed(clip, noise, adaptive, noise_allocation, extra):
  del adaptive, noise_allocation, extra   # Checked by build_dp_aggregator: none for fixed.
  return FixedClipGaussianFactory(clip=clip, **noise)


def _adaptive(clip, noise, adaptive, noise_allocation, extra):
  del noise_allocation, extra
  return AdaptiveClipGaussianFactory(initial_clip=clip, adaptive=adaptive, **noise)


def _per_layer_adaptive(clip, noise, adaptive, noise_allocation, extra):
  return PerLayerAdaptiveClipFactory(initial_clip=clip, noise_allocation=noise_allocation,
                                     adaptive=adaptive, **noise, **extra)


def _joint(clip, noise, adaptive, noise_allocation, extra):
  return JointClipFactory(initial_scale=clip, noise_allocation=noise_allocation,
                          adaptive=adaptive, **noise, **extra)


def _ftrl(clip, noise, adaptive, noise_allocation, extra):
  del adaptive, noise_allocation
  return FtrlFactory(clip=clip, **noise, **extra)


def _ftrl_adaptive(clip, noise, adaptive, noise_allocation, extra):
  del noise_allocation
  return FtrlAdaptiveFactory(initial_clip=clip, adaptive=adaptive, **noise, **extra)


# DP kind -> factory builder (`clip` is the initial clip, or the initial scale alpha for joint).
def _correlated(kind):
  def build(clip, noise, adaptive, noise_allocation, extra):
    del adaptive, noise_allocation
    return CorrelatedNoiseFactory.for_schedule(kind, clip=clip, **noise, **extra)
  return build


_FACTORIES = {'fixed': _fixed, 'adaptive': _adaptive, 'per_layer_adaptive': _per_layer_adaptive,
              'joint': _joint, 'ftrl': _ftrl, 'ftrl_adaptive': _ftrl_adaptive,
              'blt': _correlated('blt'), 'bandmf': _correlated('bandmf')}
# Extra keyword arguments a kind takes (None: any, checked by its factory: `groups`, ...);
# kinds not listed take none.
_EXTRA_ARGUMENTS = {'per_layer_adaptive': None, 'joint': None,
                    'ftrl': ('rounds_per_epoch', 'noise_seed'),
                    'ftrl_adaptive': ('rounds_per_epoch', 'noise_seed', 'restart_warmup',
                                      'restart_frequency')}
_CORRELATED_ARGUMENTS = ('rounds', 'min_separation', 'max_participations', 'bands',
                         'noise_seed', 'amplified')
_EXTRA_ARGUMENTS.update({kind: _CORRELATED_ARGUMENTS for kind in choices.CORRELATED_DP_KINDS})
TREE_KINDS = choices.TREE_DP_KINDS
choices.check_implemented([k for k in choices.DP_KINDS if k != 'none'], _FACTORIES,
                          'tff_dp.aggregators DP kinds')
DP_KINDS = tuple(_FACTORIES)


def build_dp_aggregator(kind: str, *, noise_multiplier: float, clients_per_round: float,
                        clip: float, adaptive: AdaptiveClipping = AdaptiveClipping(),
                        noise_allocation: str = 'proportional', **kwargs):
  """The factory for `kind` (`clip` is the initial clip, or initial scale alpha for joint;
  `adaptive`: how adaptive kinds adapt it, unused by fixed kinds).

  Extra keyword arguments go to the per_layer_adaptive (`groups`) and joint (`groups`,
  `joint_clip`, `adaptive_scales`) factories, and to the tree factories (`rounds_per_epoch`,
  `noise_seed`; ftrl_adaptive also `restart_warmup`, `restart_frequency`), and to the
  correlated-noise factories (blt, bandmf: `rounds`, `min_separation`, `max_participations`,
  and `bands`, `noise_seed`, `amplified`; `CorrelatedNoiseFactory.for_schedule`); anything
  else is a UserInputError. ftrl_adaptive adapts geometrically (as TFF); the tree factories use no
  `noise_allocation`.
  """
  if kind not in DP_KINDS:
    raise UserInputError(f'unknown DP aggregation kind {kind!r}; choose one of '
                         f'{", ".join(DP_KINDS)}')
  noise_budget.check_noise_allocation(noise_allocation)
  allowed = _EXTRA_ARGUMENTS.get(kind, ())
  unknown = sorted(set(kwargs) - set(allowed)) if allowed is not None else []
  if unknown:
    raise UserInputError(f'DP aggregation kind {kind!r} does not take {", ".join(unknown)}'
                         + (f' (it takes {", ".join(allowed)})' if allowed else ''))
  noise = dict(noise_multiplier=noise_multiplier, clients_per_round=clients_per_round)
  return _FACTORIES[kind](clip, noise, adaptive, noise_allocation, kwargs)
