"""DP-FedAvg with one flat clip adapted to a target quantile of the update norms (Andrew et al.
2021), the quantile estimated from a noised clipped count."""

from tff_dp.accounting import noise_families
from tff_dp.mechanisms import base


def _factory(request: base.FactoryRequest):
  from tff_dp.aggregators import adaptive as adaptive_lib  # pylint: disable=g-import-not-at-top
  return adaptive_lib.AdaptiveClipGaussianFactory(
      initial_clip=request.clip, adaptive=request.adaptive,
      noise_multiplier=request.noise_multiplier, clients_per_round=request.clients_per_round)


MECHANISM = base.Mechanism(
    name='adaptive', description='flat clip adapted to a target quantile of update norms',
    noise=noise_families.INDEPENDENT, samplers=('poisson', 'fixed_size'), build_factory=_factory,
    adapts_clip=True)
