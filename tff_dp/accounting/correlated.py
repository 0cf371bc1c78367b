"""Accounting of correlated-noise DP-FTRL (BLT, banded matrix factorization) under min-separation
participation: each client participates at most k times, at least b rounds apart.

The mechanism releases C x + z over the run (z ~ N(0, sigma^2) per coordinate and round, then
post-processed), so the whole run is one Gaussian mechanism. With each client's contribution
to a round's sum of norm at most `clip`, and C non-negative (so C^T C is too), a client moves
C x by at most clip x sens_n, sens_n^2 = `toeplitz.sensitivity_squared` of the n-round
strategy. Fresh draws are scaled by z x clip x sens_n, so the run is the Gaussian mechanism with
noise multiplier z (add/remove: a client's rounds become zero); after round t it is the
mechanism on the first t rounds, a Gaussian with multiplier z x sens_n / sens_t >= z.

The noise multiplier that meets a target epsilon depends only on z, never on the strategy: the
strategy decides how much of that noise ends up in the model (`toeplitz.loss`).

Amplified BandMF (Choquette-Choo et al. 2023, "Amplified BandMF", Theorem 4): with a strategy
of `bands` coefficients and cyclic Poisson sampling over `groups` >= bands groups (round t
samples each client of group t mod groups with probability q), a client's participations are
at least `groups` rounds apart, so each moves a block of rows of C x no other participation
touches, by at most clip x ||column of C||. Fresh draws are then scaled by z x clip x that
column norm, and the run after round t is the ceil(t / groups)-fold composition of the
Poisson-sampled (q) Gaussian with multiplier z.
"""

import dataclasses
import math
from typing import Optional

import dp_accounting
import numpy as np

from tff_dp import errors
from tff_dp import ledger
from tff_dp.accounting import delta as delta_lib
from tff_dp.accounting import rdp_gaussian
from tff_dp.matrix_factorization import banded
from tff_dp.matrix_factorization import blt
from tff_dp.matrix_factorization import toeplitz

_RELATION = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


@dataclasses.dataclass(frozen=True)
class Strategy:
  """A correlated-noise strategy for n rounds: the mechanism that built it
  (`tff_dp.mechanisms`), its Toeplitz coefficients, its parameters (BLT: buf_decay,
  output_scale; banded: bands), sens_n^2 and loss."""
  mechanism: str
  coefs: tuple
  params: dict
  sensitivity_squared: float
  loss: float


def strategy(mechanism: str, coefs, params: dict, rounds: int, min_separation: int,
             max_participations: int, *, amplified: bool = False) -> Strategy:
  """The strategy with Toeplitz `coefs` (and the `params` the ledger records of it) that
  mechanism `mechanism` built for the schedule. `amplified` (a banded strategy under cyclic
  Poisson sampling over min_separation groups): the sensitivity is one participation's, the
  largest column norm (the module docstring)."""
  check_schedule(rounds, min_separation, max_participations)
  participations = 1 if amplified else max_participations
  sens2 = toeplitz.sensitivity_squared(coefs, rounds, min_separation, participations)
  return Strategy(mechanism, tuple(float(c) for c in coefs), dict(params), sens2,
                  toeplitz.loss(coefs, rounds, min_separation, participations))


def check_bands_within_groups(bands: int, groups: int) -> None:
  """UserInputError unless a banded strategy with `bands` bands fits cyclic Poisson sampling
  over `groups` groups (Theorem 4: no band spans two participations of a client)."""
  if bands > groups:
    raise errors.UserInputError(
        f'`bands={bands}` exceeds the {groups} groups of cyclic Poisson sampling: one band '
        'would span two participations of a client; use `bands` <= the groups')


def not_amplifiable(mechanism: str) -> errors.UserInputError:
  """The refusal of cyclic Poisson sampling for a strategy that is not banded."""
  return errors.UserInputError(
      f'`dp={mechanism}` cannot be amplified by cyclic Poisson sampling (its noise spans all '
      'rounds, not bands): only a banded strategy is; use a banded mechanism, or '
      'min-separation sampling')


def check_amplified_record(noise: ledger.CorrelatedNoise, groups: int) -> None:
  """UserInputError unless cyclic Poisson sampling over `groups` groups amplifies the recorded
  strategy: a banded one (its noise spans bands, not all rounds) whose bands fit the groups."""
  if noise.bands is None:
    raise not_amplifiable(noise.mechanism)
  check_bands_within_groups(noise.bands, groups)


def coefs_of(noise: ledger.CorrelatedNoise) -> np.ndarray:
  """The Toeplitz coefficients of a recorded strategy, for its `rounds`: from its recorded
  parameters (a banded square root's bands, or a BLT's buffers), whatever its name."""
  if noise.coefs:
    return np.asarray(noise.coefs, dtype=np.float64)
  if noise.bands is not None:
    return banded.banded_sqrt_coefs(noise.bands)
  return blt.BLT(noise.buf_decay, noise.output_scale).coefs(noise.rounds)


def recorded(found: Strategy, rounds: int, min_separation: int,
             max_participations: int) -> ledger.CorrelatedNoise:
  """What the ledger records of a strategy and its schedule: its parameters (a BLT's buffers,
  a banded strategy's bands), or, for a strategy with neither, its coefficients."""
  named = 'bands' in found.params or 'buf_decay' in found.params
  return ledger.CorrelatedNoise(
      found.mechanism, rounds, min_separation, max_participations,
      buf_decay=tuple(found.params.get('buf_decay', ())),
      output_scale=tuple(found.params.get('output_scale', ())),
      bands=found.params.get('bands'), coefs=() if named else found.coefs)


def check_schedule(rounds, min_separation, max_participations) -> None:
  """UserInputError unless each client's at most `max_participations` participations, at
  least `min_separation` rounds apart, fit in `rounds` rounds."""
  for name, value in (('rounds', rounds), ('min_separation', min_separation),
                      ('max_participations', max_participations)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise errors.UserInputError(f'`{name}` must be a positive integer, got {value!r}.')
  fit = -(-rounds // min_separation)   # Participations min_separation apart in `rounds`.
  if max_participations > fit:
    raise errors.UserInputError(
        f'`max_participations={max_participations}`: in {rounds} rounds, participations '
        f'{min_separation} rounds apart fit at most {fit} times; use `max_participations` <= '
        f'{fit}')


def planned_schedule(own, cycle: int, total_rounds: int) -> dict:
  """The schedule a strategy is planned for: the sampler visits each client every `cycle`
  rounds, so at least `cycle` rounds apart and at most ceil(total_rounds / cycle) times; the
  mechanism's own settings (`own`) `min_separation` may only lower the first, and
  `max_participations` only raise the second (a weaker claim is still true)."""
  needed = math.ceil(total_rounds / cycle)
  separation = own.get('min_separation') or cycle
  participations = own.get('max_participations') or needed
  if separation > cycle:
    raise errors.UserInputError(
        f'`min_separation={separation}`: the sampler visits each client every {cycle} rounds '
        f'(population // clients_per_round); use `min_separation` <= {cycle}, or fewer '
        'clients per round')
  if participations < needed:
    raise errors.UserInputError(
        f'`max_participations={participations}`: over {total_rounds} rounds a client '
        f'participates up to {needed} times (every {cycle} rounds); use '
        f'`max_participations` >= {needed} or fewer rounds')
  return dict(rounds=total_rounds, min_separation=separation,
              max_participations=participations, bands=own.get('bands'))


def gaussian_epsilon(z: float, delta: float, method: str = 'rdp') -> float:
  """Epsilon at delta of the Gaussian mechanism with noise multiplier z (add/remove)."""
  if z == math.inf:
    return 0.0
  return float(_accountant(method).compose(dp_accounting.GaussianDpEvent(z)).get_epsilon(delta))


def epsilon_curve(coefs, rounds: int, min_separation: int, max_participations: int,
                  noise_multiplier: float, delta: float, method: str = 'rdp') -> list[float]:
  """Epsilon after each round t = 1..rounds: a Gaussian with multiplier
  noise_multiplier x sens_n / sens_t (the module docstring)."""
  sens_n = math.sqrt(toeplitz.sensitivity_squared(coefs, rounds, min_separation,
                                                  max_participations))
  curve = []
  for t in range(1, rounds + 1):
    sens_t = math.sqrt(toeplitz.sensitivity_squared(coefs, t, min_separation,
                                                    max_participations))
    curve.append(gaussian_epsilon(noise_multiplier * sens_n / sens_t, delta, method))
  return curve


def amplified_event(probability: float, noise_multiplier: float,
                    compositions: int) -> dp_accounting.DpEvent:
  """Amplified BandMF after `compositions` cycles: that many Poisson-sampled Gaussians."""
  return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      probability, dp_accounting.GaussianDpEvent(noise_multiplier)), compositions)


def amplified_rdp(probability: float, noise_multiplier: float, compositions: int,
                  orders) -> np.ndarray:
  """RDP at `orders` of `amplified_event` (the vectorised series, as runs compose it)."""
  return compositions * rdp_gaussian.poisson_sampled_gaussian_rdp(
      probability, noise_multiplier, orders)


def amplified_epsilon(probability: float, noise_multiplier: float, compositions: int,
                      delta: float, method: str = 'rdp') -> float:
  """Epsilon at delta of `amplified_event` (add/remove)."""
  if noise_multiplier == math.inf:
    return 0.0
  return float(_accountant(method).compose(amplified_event(
      probability, noise_multiplier, compositions)).get_epsilon(delta))


def _accountant(method: str):
  return (dp_accounting.rdp.RdpAccountant(neighboring_relation=_RELATION) if method == 'rdp'
          else dp_accounting.pld.PLDAccountant(neighboring_relation=_RELATION))


def calibrate(target_epsilon: float, delta: float, method: str = 'rdp', tol: float = 1e-6,
              *, probability: Optional[float] = None, compositions: int = 1) -> float:
  """The smallest noise multiplier z (within tol) whose mechanism meets (target_epsilon,
  delta): the Gaussian (the run's z for any strategy under min separation), or with
  `probability`, amplified BandMF over `compositions` cycles."""
  delta = delta_lib.check_delta(delta)
  if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
    raise errors.UserInputError(f'target_epsilon must be positive and finite, got '
                                f'{target_epsilon}.')
  if probability is None:
    event = dp_accounting.GaussianDpEvent
  else:
    event = lambda z: amplified_event(probability, z, compositions)
  lo, hi = 1e-3, 1.0
  while _accountant(method).compose(event(hi)).get_epsilon(delta) > target_epsilon:
    lo, hi = hi, hi * 2
  z = dp_accounting.calibrate_dp_mechanism(
      lambda: _accountant(method), event, target_epsilon, delta,
      bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi), tol=tol)
  return float(z)


def noise_std_in_model(coefs, rounds: int, stddev: float) -> float:
  """The std of the noise in the final prefix sum (one coordinate) of the strategy with
  Toeplitz `coefs` whose fresh draws have `stddev` (z x clip x sens_n): stddev x ||last row
  of A C^-1||, the figure a run whose clients send zero updates measures."""
  max_error, _ = toeplitz.prefix_sum_errors(coefs, rounds)
  return float(stddev * math.sqrt(max_error))


def describe(found: Strategy) -> list[str]:
  """The lines the calibration CLI prints for a strategy (names as jax_privacy's)."""
  lines = [f'{name}={[float(v) for v in value]!r}' if isinstance(value, list)
           else f'{name}={value!r}' for name, value in found.params.items()]
  lines.append(f'sensitivity={math.sqrt(found.sensitivity_squared)!r} '
               f'loss={found.loss!r}')
  return lines
