"""DP-FedAvg with joint clipping: one clip over per-vector scales that adapt to the update
norms of each group (`clip` is the initial scale alpha)."""

from tff_dp.accounting import noise_families
from tff_dp.mechanisms import base


def _factory(request: base.FactoryRequest):
  from tff_dp.aggregators import joint  # pylint: disable=g-import-not-at-top  (TensorFlow)
  return joint.JointClipFactory(
      initial_scale=request.clip, noise_allocation=request.noise_allocation,
      adaptive=request.adaptive, noise_multiplier=request.noise_multiplier,
      clients_per_round=request.clients_per_round, **request.own)


MECHANISM = base.Mechanism(
    name='joint', description='joint clipping with adaptive per-vector scales',
    noise=noise_families.INDEPENDENT, samplers=('poisson', 'fixed_size'), build_factory=_factory,
    extra_arguments=None, adapts_clip=True)
