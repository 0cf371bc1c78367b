"""DP-FedAvg with a fixed clip: every round's clipped sum gets fresh Gaussian noise."""

from tff_dp.accounting import noise_families
from tff_dp.mechanisms import base


def _factory(request: base.FactoryRequest):
  from tff_dp.aggregators import fixed  # pylint: disable=g-import-not-at-top  (TensorFlow)
  return fixed.FixedClipGaussianFactory(clip=request.clip,
                                        noise_multiplier=request.noise_multiplier,
                                        clients_per_round=request.clients_per_round)


MECHANISM = base.Mechanism(
    name='fixed', description='fixed clip norm', noise=noise_families.INDEPENDENT,
    samplers=('poisson', 'fixed_size'), build_factory=_factory)
