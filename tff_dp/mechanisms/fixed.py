"""DP-FedAvg with a fixed clip: every round's clipped sum gets fresh Gaussian noise."""

from tff_dp.mechanisms import base


def _factory(clip, noise, adaptive, noise_allocation, extra):
  del adaptive, noise_allocation, extra
  from tff_dp.aggregators import fixed  # pylint: disable=g-import-not-at-top  (TensorFlow)
  return fixed.FixedClipGaussianFactory(clip=clip, **noise)


MECHANISM = base.Mechanism(
    name='fixed', description='fixed clip norm', noise='independent',
    samplers=('poisson', 'fixed_size'), build_factory=_factory)
