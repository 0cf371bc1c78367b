"""DP-FedAvg with one adaptive clip per layer (or per group of layers), the noise split across
the groups by `noise_allocation`."""

from tff_dp.mechanisms import base


def _factory(clip, noise, adaptive, noise_allocation, extra):
  from tff_dp.aggregators import per_layer  # pylint: disable=g-import-not-at-top  (TensorFlow)
  return per_layer.PerLayerAdaptiveClipFactory(
      initial_clip=clip, noise_allocation=noise_allocation, adaptive=adaptive, **noise, **extra)


MECHANISM = base.Mechanism(
    name='per_layer_adaptive', description='one adaptive clip per layer', noise='independent',
    samplers=('poisson', 'fixed_size'), build_factory=_factory, extra_arguments=None,
    adapts_clip=True)
