"""DP-FedAvg with one flat clip adapted to a target quantile of the update norms (Andrew et al.
2021), the quantile estimated from a noised clipped count."""

from tff_dp.mechanisms import base


def _factory(clip, noise, adaptive, noise_allocation, extra):
  del noise_allocation, extra
  from tff_dp.aggregators import adaptive as adaptive_lib  # pylint: disable=g-import-not-at-top
  return adaptive_lib.AdaptiveClipGaussianFactory(initial_clip=clip, adaptive=adaptive, **noise)


MECHANISM = base.Mechanism(
    name='adaptive', description='flat clip adapted to a target quantile of update norms',
    noise='independent', samplers=('poisson', 'fixed_size'), build_factory=_factory,
    adapts_clip=True)
