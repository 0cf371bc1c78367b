"""DP-FTRL with tree-aggregation noise and a fixed clip (Kairouz et al. 2021), restarted every
epoch of shuffled participation."""

from tff_dp.mechanisms import base


def _factory(clip, noise, adaptive, noise_allocation, extra):
  del adaptive, noise_allocation
  from tff_dp.aggregators import ftrl  # pylint: disable=g-import-not-at-top  (TensorFlow)
  return ftrl.FtrlFactory(clip=clip, **noise, **extra)


MECHANISM = base.Mechanism(
    name='ftrl',
    description='DP-FTRL: tree-aggregation noise, fixed clip (needs `client_sampling=shuffled`)',
    noise='tree', samplers=('shuffled',), build_factory=_factory,
    extra_arguments=('rounds_per_epoch', 'noise_seed'))
