"""DP-FTRL with tree-aggregation noise and a quantile-adapted clip, adopted when a tree restarts
(TFF's tree_adaptive schedule: `restart_warmup` rounds, then every `restart_frequency`)."""

from tff_dp.errors import UserInputError
from tff_dp.mechanisms import base


def _factory(clip, noise, adaptive, noise_allocation, extra):
  del noise_allocation
  from tff_dp.aggregators import ftrl_adaptive  # pylint: disable=g-import-not-at-top
  return ftrl_adaptive.FtrlAdaptiveFactory(initial_clip=clip, adaptive=adaptive, **noise,
                                           **extra)


def _check(dp) -> None:
  # TFF's schedule requires it (tfp checks it again when the factory is built; here it is
  # reported before TensorFlow loads).
  if dp.restart_warmup >= dp.restart_frequency:
    raise UserInputError(f'`restart_warmup` ({dp.restart_warmup}) must be smaller than '
                         f'`restart_frequency` ({dp.restart_frequency})')


MECHANISM = base.Mechanism(
    name='ftrl_adaptive',
    description='DP-FTRL with a quantile-adapted clip, adopted at tree restarts (needs '
                '`client_sampling=shuffled`)',
    noise='tree', samplers=('shuffled',), build_factory=_factory,
    extra_arguments=('rounds_per_epoch', 'noise_seed', 'restart_warmup', 'restart_frequency'),
    adapts_clip=True, settings=('restart_warmup', 'restart_frequency'), check=_check)
