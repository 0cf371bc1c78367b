"""DP-FedAvg with joint clipping: one clip over per-vector scales that adapt to the update
norms of each group (`clip` is the initial scale alpha)."""

from tff_dp.mechanisms import base


def _factory(clip, noise, adaptive, noise_allocation, extra):
  from tff_dp.aggregators import joint  # pylint: disable=g-import-not-at-top  (TensorFlow)
  return joint.JointClipFactory(initial_scale=clip, noise_allocation=noise_allocation,
                                adaptive=adaptive, **noise, **extra)


MECHANISM = base.Mechanism(
    name='joint', description='joint clipping with adaptive per-vector scales',
    noise='independent', samplers=('poisson', 'fixed_size'), build_factory=_factory,
    extra_arguments=None, adapts_clip=True)
