"""DP-FTRL with tree-aggregation noise and a fixed clip (Kairouz et al. 2021), restarted every
epoch of shuffled participation."""

from tff_dp.accounting import noise_families
from tff_dp.mechanisms import base


def _factory(request: base.FactoryRequest):
  from tff_dp.aggregators import ftrl  # pylint: disable=g-import-not-at-top  (TensorFlow)
  return ftrl.FtrlFactory(clip=request.clip, noise_multiplier=request.noise_multiplier,
                          clients_per_round=request.clients_per_round, **request.own)


MECHANISM = base.Mechanism(
    name='ftrl',
    description='DP-FTRL: tree-aggregation noise, fixed clip (needs `client_sampling=shuffled`)',
    noise=noise_families.TREE, samplers=('shuffled',), build_factory=_factory,
    extra_arguments=('rounds_per_epoch', 'noise_seed'))
