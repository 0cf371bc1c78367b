"""DP-FTRL with buffered linear Toeplitz (BLT) noise (Dvijotham et al. 2024; McKenna 2024): the
strategy optimized for the schedule, its noise streamed with a few model-sized buffers."""

from tff_dp.matrix_factorization import blt
from tff_dp.accounting import noise_families
from tff_dp.mechanisms import base


def _coefs(rounds, min_separation, max_participations, bands, max_buffers):
  del bands
  found, _ = blt.optimize(rounds, min_separation, max_participations, max_buffers=max_buffers)
  return found.coefs(rounds), {'buf_decay': list(found.buf_decay),
                               'output_scale': list(found.output_scale)}


MECHANISM = base.Mechanism(
    name='blt',
    description='DP-FTRL with buffered linear Toeplitz noise, fixed clip (needs '
                '`client_sampling=min_separation`)',
    noise=noise_families.CORRELATED, samplers=('min_separation',),
    extra_arguments=base.CORRELATED_ARGUMENTS,
    settings=(base.CorrelatedSchedule,), strategy_coefs=_coefs)
