"""DP-FTRL with tree-aggregation noise and a quantile-adapted clip, adopted when a tree restarts
(TFF's tree_adaptive schedule: `restart_warmup` rounds, then every `restart_frequency`)."""

import dataclasses

from tff_dp import sections
from tff_dp.errors import UserInputError
from tff_dp.accounting import noise_families
from tff_dp.mechanisms import base


def _factory(request: base.FactoryRequest):
  from tff_dp.aggregators import ftrl_adaptive  # pylint: disable=g-import-not-at-top
  return ftrl_adaptive.FtrlAdaptiveFactory(
      initial_clip=request.clip, adaptive=request.adaptive,
      noise_multiplier=request.noise_multiplier, clients_per_round=request.clients_per_round,
      **request.own)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TreeRestarts(sections.Section):
  """DP-FTRL with an adapted clip: when the tree restarts and adopts the clip estimate."""
  SECTION = 'tree_restarts'
  FOLLOWS = 'dp'
  restart_warmup: int = sections.setting(
      128, '`dp=ftrl_adaptive`: restart the tree (adopting the clip estimate) after this many '
      'rounds (TFF\'s default), ...', check=sections.POSITIVE)
  restart_frequency: int = sections.setting(
      1024, '... then every this many rounds (and after every epoch of shuffled '
      'participation).', check=sections.POSITIVE)

  def _check(self) -> None:
    # TFF's schedule requires it (tfp checks it again when the factory is built; here it is
    # reported before TensorFlow loads).
    if self.restart_warmup >= self.restart_frequency:
      raise UserInputError(f'`restart_warmup` ({self.restart_warmup}) must be smaller than '
                           f'`restart_frequency` ({self.restart_frequency})')


MECHANISM = base.Mechanism(
    name='ftrl_adaptive',
    description='DP-FTRL with a quantile-adapted clip, adopted at tree restarts (needs '
                '`client_sampling=shuffled`)',
    noise=noise_families.TREE, samplers=('shuffled',), build_factory=_factory,
    extra_arguments=('rounds_per_epoch', 'noise_seed', 'restart_warmup', 'restart_frequency'),
    adapts_clip=True, settings=(TreeRestarts,))
