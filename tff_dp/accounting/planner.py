"""The privacy planner: epsilon against rounds, for a grid of noise multipliers and cohort
sizes, for each mechanism the package offers, before anything is trained.

Each point is a run of that many rounds at that setting. DP-FedAvg (Poisson sampling) and the
tree (shuffled participation, a tree per epoch of population // m rounds) are composed round by
round by the accountant runs use (`LedgerAccountant`, fed the ledger records those runs would
write, with unit clip). BLT and BandMF under min separation are one Gaussian mechanism with
multiplier z whatever the rounds and strategy (`correlated`): their epsilon is flat in the
rounds, and what more rounds cost them is noise in the model, not epsilon. Amplified BandMF
is `correlated.amplified_epsilon` over ceil(t / bands) cycles.
"""

import dataclasses
import math
from typing import Optional, Sequence

from dp_accounting.rdp import rdp_privacy_accountant
import numpy as np

from tff_dp import choices
from tff_dp import errors
from tff_dp import ledger
from tff_dp import sampling
from tff_dp.accounting import accountant as accountant_lib
from tff_dp.accounting import correlated
from tff_dp.accounting import delta as delta_lib

# The mechanisms the planner draws: name -> what it is (each a panel of the picture).
MECHANISMS = {
    'gaussian': 'DP-FedAvg: Gaussian noise each round, Poisson sampling',
    'tree': 'DP-FTRL: tree aggregation restarted every epoch of shuffling (per-node z)',
    'correlated': 'correlated noise (any strategy) under min separation: one Gaussian for the '
                  'whole run (flat)',
    'amplified_bandmf': 'amplified BandMF: cyclic Poisson over `bands` groups',
}

# What a panel's noise multiplier means where it is not DP-FedAvg's per-round z (written on
# the panel: the same letter, another quantity).
Z_MEANS = {
    'correlated': 'z here: noise of the whole run\'s one Gaussian mechanism (the\n'
                  'strategy\'s noise std / its sensitivity), not a per-round z.\n'
                  'Epsilon does not grow with rounds or clients per round:\n'
                  'more rounds cost noise in the model, not epsilon.',
}


@dataclasses.dataclass(frozen=True)
class Curve:
  """Epsilon (RDP accountant) after each of `rounds` for one mechanism and setting."""
  mechanism: str
  noise_multiplier: float
  clients_per_round: int
  rounds: tuple
  epsilons: tuple

  def rounds_within(self, target: float) -> int:
    """The most rounds whose epsilon stays at or below `target` (0 if none; among `rounds`)."""
    within = [r for r, e in zip(self.rounds, self.epsilons) if e <= target]
    return max(within) if within else 0


def round_grid(total_rounds: int, points: int = 40) -> tuple:
  """About `points` round counts from 1 to total_rounds, spaced evenly on a log scale."""
  grid = np.unique(np.round(np.geomspace(1, total_rounds, points)).astype(int))
  return tuple(int(r) for r in grid)


def _record(mechanism: str, r: int, population: int, m: int,
            z: float) -> ledger.RoundRecord:
  query = (ledger.GaussianSumQuery('update', 1.0, z),)
  if mechanism == 'gaussian':
    return ledger.RoundRecord(r, ledger.SamplingEvent('poisson', population,
                                                      probability=m / population), query)
  per_epoch = population // m
  event = ledger.SamplingEvent('shuffled', population, sample_size=m,
                               epoch=(r - 1) // per_epoch + 1)
  return ledger.RoundRecord(r, event, query, (r - 1) % per_epoch + 1)


def _composed_curve(mechanism: str, rounds: Sequence[int], population: int, m: int,
                    z: float, delta: float) -> list[float]:
  acc = accountant_lib.LedgerAccountant(delta, ('rdp',))   # The claim's relation.
  wanted, epsilons = set(rounds), []
  for r in range(1, max(rounds) + 1):
    acc.add(_record(mechanism, r, population, m, z))
    if r in wanted:
      epsilons.append(float(acc.epsilon_rdp()))
  return epsilons


def _amplified_curve(rounds: Sequence[int], population: int, m: int, z: float, bands: int,
                     delta: float) -> list[float]:
  q = sampling.cyclic_poisson_probability(population, m, bands)
  orders = rdp_privacy_accountant.DEFAULT_RDP_ORDERS
  once = correlated.amplified_rdp(q, z, 1, orders)
  return [float(rdp_privacy_accountant.compute_epsilon(
      orders, math.ceil(r / bands) * once, delta)[0]) for r in rounds]


def curves(*, total_rounds: int, population: int, delta: float,
           noise_multipliers: Sequence[float], cohort_sizes: Sequence[int],
           mechanisms: Optional[Sequence[str]] = None, bands: Optional[int] = None,
           points: int = 40) -> list[Curve]:
  """A `Curve` per mechanism and (noise multiplier, cohort size) pair of the grid (amplified
  BandMF only with `bands`, and then by default)."""
  delta = delta_lib.check_delta(delta, population)
  mechanisms = list(mechanisms or [k for k in MECHANISMS
                                   if k != 'amplified_bandmf' or bands is not None])
  if 'amplified_bandmf' in mechanisms and bands is None:
    raise errors.UserInputError('amplified BandMF needs `bands` (its number of groups)')
  unknown = sorted(set(mechanisms) - set(MECHANISMS))
  if unknown:
    raise errors.UserInputError(f'the planner draws {choices.one_of(MECHANISMS)}, not '
                                f'{", ".join(unknown)}')
  for m in cohort_sizes:
    if not 1 <= m <= population:
      raise errors.UserInputError(f'cohort size {m} must be in [1, {population}] (the '
                                  'population)')
  if any(not z > 0 for z in noise_multipliers):
    raise errors.UserInputError('noise multipliers must be positive')
  rounds = round_grid(total_rounds, points)
  found = []
  for mechanism in mechanisms:
    for z in noise_multipliers:
      for m in cohort_sizes:
        if mechanism == 'correlated':
          epsilons = [correlated.gaussian_epsilon(z, delta)] * len(rounds)
        elif mechanism == 'amplified_bandmf':
          epsilons = _amplified_curve(rounds, population, m, z, bands, delta)
        else:
          epsilons = _composed_curve(mechanism, rounds, population, m, z, delta)
        found.append(Curve(mechanism, float(z), int(m), rounds, tuple(epsilons)))
  return found
