"""DP-FTRL with banded matrix-factorization noise (Choquette-Choo et al. 2023): the column-
normalized banded square root with `bands` coefficients (default: min_separation, so a client's
participations never share a band); with cyclic Poisson sampling over `bands` groups, amplified
("(Amplified) Banded Matrix Factorization", Theorem 4)."""

import dataclasses
from typing import Optional

from tff_dp import sections
from tff_dp.matrix_factorization import banded
from tff_dp.accounting import noise_families
from tff_dp.mechanisms import base


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bands(sections.Section):
  """Banded matrix-factorization noise: its number of bands."""
  SECTION = 'bands'
  FOLLOWS = 'dp'
  bands: Optional[int] = sections.setting(
      None, '`dp=bandmf`: bands of the strategy (default `min_separation`); with '
      '`client_sampling=cyclic_poisson` (required), also its number of groups.',
      check=sections.at_least(1))


def _coefs(rounds, min_separation, max_participations, bands, max_buffers):
  del max_participations, max_buffers
  bands = min(bands or min_separation, rounds)
  return banded.banded_sqrt_coefs(bands), {'bands': int(bands)}


MECHANISM = base.Mechanism(
    name='bandmf',
    description='DP-FTRL with banded matrix-factorization noise, fixed clip (needs '
                '`client_sampling=min_separation`, or `cyclic_poisson` for amplification)',
    noise=noise_families.CORRELATED, samplers=('min_separation', 'cyclic_poisson'),
    extra_arguments=base.CORRELATED_ARGUMENTS,
    settings=(base.CorrelatedSchedule, Bands), strategy_coefs=_coefs)
