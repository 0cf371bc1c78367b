"""DP-FedAvg with one adaptive clip per layer (or per group of layers), the noise split across
the groups by `noise_allocation`."""

from tff_dp.accounting import noise_families
from tff_dp.mechanisms import base


def _factory(request: base.FactoryRequest):
  from tff_dp.aggregators import per_layer  # pylint: disable=g-import-not-at-top  (TensorFlow)
  return per_layer.PerLayerAdaptiveClipFactory(
      initial_clip=request.clip, noise_allocation=request.noise_allocation,
      adaptive=request.adaptive, noise_multiplier=request.noise_multiplier,
      clients_per_round=request.clients_per_round, **request.own)


MECHANISM = base.Mechanism(
    name='per_layer_adaptive', description='one adaptive clip per layer', noise=noise_families.INDEPENDENT,
    samplers=('poisson', 'fixed_size'), build_factory=_factory, extra_arguments=None,
    adapts_clip=True)
