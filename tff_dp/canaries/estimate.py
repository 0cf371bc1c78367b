"""One-shot empirical privacy estimates from canary cosines (Andrew, Kairouz, Oh, Oprea, McMahan,
Suriyakumar, "One-shot Empirical Privacy Estimation for Federated Learning", ICLR 2024).

Pure numpy/scipy: no TensorFlow, no state. The loop supplies model changes as flat vectors
(`directions.flatten`) and directions as a matrix or as row blocks (`CanaryDirections.blocks`).

The method. K inserted canary clients each contribute a fixed random unit direction c_k
(clipped to the clip norm S); K' unseen canaries have directions that are never inserted.

* Final-model threat model: the adversary sees only the total model change Delta (last minus
  initial weights) and tests, for a canary direction c, whether c was inserted. Statistic:
  cos(Delta, c). For an unseen c (independent of Delta and isotropic) it is exactly the cosine
  of a uniform direction with a fixed vector, ~ N(0, 1/d) for large d (the paper's closed-form
  null, Sec. 4; its code uses the Gaussian form for d >= 1000). The inserted cosines are fitted
  with a Gaussian N(mu, sigma^2), and the estimate is the epsilon at the run's delta of the
  pair of Gaussians (null, fitted): `gaussian_pair_epsilon`. On the Gaussian mechanism (one
  round, every canary inserted, noise N(0, z^2 S^2 I)) the cosines are mu ~ S/|Delta| and
  sigma ~ z S/|Delta| while the null std is 1/sqrt(d) ~ z S/|Delta| too, so the estimate tends
  to the mechanism's exact epsilon (sensitivity S, noise std z S) as d grows with K/d -> 0.
* All-iterates threat model: the adversary sees every round's model change Delta_t; per
  canary the statistic is max_t cos(Delta_t, c). Its null distribution (the max of T nearly
  independent N(0, 1/d)) has no simple closed form, so the same statistic is computed for the
  unseen canaries and both sets are fitted with Gaussians; the estimate is again
  `gaussian_pair_epsilon` of the two fits (the paper's code keeps the running max cosine of
  inserted and of unseen canaries in its server state, and its two-Gaussian epsilon takes any
  two means and stds). A maximum is not Gaussian, and the two fitted stds differ (the inserted
  maxima spread more), so this estimate is a heuristic: in a simulation where each canary is
  inserted in one of 10 Gaussian rounds (noise std 0.3 per unit signal) it came out at 32-45
  against the per-round mechanism's exact 19.

`gaussian_pair_epsilon` is the smallest epsilon >= 0 such that both hockey-stick divergences
E_Q[(1 - e^(epsilon - L))_+] between P = N(m0, s0^2) and Q = N(m1, s1^2) (each way round) are at
most delta, i.e. the (epsilon, delta) of the mechanism whose two neighbouring outputs are P and
Q (Steinke, "Composition of DP & privacy amplification by subsampling", 2022, which the
paper's code cites). With equal stds and m = |m1 - m0| / s it is the Gaussian mechanism's
delta(epsilon) = Phi(-epsilon/m + m/2) - e^epsilon Phi(-epsilon/m - m/2) (Balle & Wang 2018).

A point estimate, not a bound (the accountant's epsilon is the bound). Its sampling error
comes from fitting mu and sigma to K statistics (relative error ~ 1/sqrt(2K) in sigma), and
since any mismatch between the fitted and the null std raises epsilon, it is biased upward at
finite K: for K = 1000 on the Gaussian mechanism at epsilon 8 (delta 1e-5), median +5%, and
with no signal at all a median of 0.28 (tests/test_canaries.py gives the simulations).
"""

import dataclasses
import math
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np
from scipy import optimize
from scipy import stats

from tff_dp.errors import UserInputError

Directions = Union[np.ndarray, Iterable[np.ndarray]]

# log delta below which a divergence counts as 0 when searching epsilon (keeps brentq finite).
_LOG_ZERO = -1e4


@dataclasses.dataclass(frozen=True)
class CanaryEstimate:
  """An empirical epsilon from canary statistics, and the Gaussian fits it came from.

  Attributes:
    epsilon: the estimated epsilon at `delta`: the epsilon of the pair of Gaussians
      N(`null_mu`, `null_sigma`^2) and N(`mu`, `sigma`^2) (`gaussian_pair_epsilon`). 0 when
      the two are indistinguishable at `delta`; `math.inf` when a fit has zero spread and the
      means differ. A point estimate of what an adversary in the threat model achieves, not an
      upper bound on the privacy loss (the accountant's epsilon is that).
    mu: mean of the inserted canaries' statistic (cosine, or max cosine over rounds).
    sigma: standard deviation (ddof=1) of the inserted canaries' statistic.
    k: number of inserted canaries the fit used.
    null_mu: mean of the null (unseen-canary) distribution: 0 for the closed-form null, else
      the mean of the unseen canaries' statistic.
    null_sigma: std of the null: 1/sqrt(d) for the closed-form null, else the std (ddof=1) of
      the unseen canaries' statistic.
    num_unseen: number of unseen canaries the null was fitted to; 0 for the closed-form null.
    delta: the delta at which `epsilon` is stated (the run's delta).
  """
  epsilon: float
  mu: float
  sigma: float
  k: int
  null_mu: float
  null_sigma: float
  num_unseen: int
  delta: float


def _vector(values: Any, name: str) -> np.ndarray:
  array = np.asarray(values, dtype=np.float64)
  if array.ndim != 1:
    raise UserInputError(f'`{name}` must be a vector, got shape {array.shape}')
  if not np.all(np.isfinite(array)):
    raise UserInputError(f'`{name}` contains NaN or infinity')
  return array


def statistics(values: Any, name: str) -> np.ndarray:
  """`values` as a finite 1-D array of at least 2 statistics (a Gaussian is fitted to them)."""
  array = _vector(values, name)
  if array.size < 2:
    raise UserInputError(f'`{name}` needs at least 2 canary statistics to fit a Gaussian, '
                         f'got {array.size}')
  return array


def check_delta(delta: Any) -> float:
  """`delta` as a float in (0, 1); UserInputError otherwise."""
  number = isinstance(delta, (int, float, np.integer, np.floating)) and not isinstance(delta, bool)
  if not number or not 0.0 < delta < 1.0:
    raise UserInputError(f'`delta` must be a number in (0, 1), got {delta!r}')
  return float(delta)


def _blocks(directions: Directions) -> Iterable[np.ndarray]:
  if isinstance(directions, np.ndarray):
    return [directions]
  return directions


def cosines(delta: Any, directions: Directions) -> np.ndarray:
  """cos(delta, c_k) for each direction c_k: float64 [number of directions].

  `delta` is a model change as a flat vector [d] (`directions.flatten`), oriented so that an
  inserted canary moves it along +c_k (see the wiring: with TFF's FedAvg, where a client's
  update is initial minus trained weights and the server subtracts it, that is initial minus
  last weights, the paper code's "negative cosines"). `directions` is a matrix [n, d] of unit
  rows or an iterable of such row blocks (`CanaryDirections.blocks`), read once. Rows are used
  as given (unit norm is the caller's contract, which `CanaryDirections` meets). A zero `delta`
  gives cosines 0, as the paper's code does (it can happen when a round's update is all zero).
  """
  delta = _vector(delta, 'delta')
  norm = float(np.linalg.norm(delta))
  parts = []
  for block in _blocks(directions):
    block = np.asarray(block, dtype=np.float64)
    if block.ndim != 2 or block.shape[1] != delta.size:
      raise UserInputError(f'`directions` must have rows of {delta.size} entries (the size of '
                           f'`delta`), got a block of shape {block.shape}')
    parts.append(block @ delta / norm if norm > 0 else np.zeros(block.shape[0]))
  return np.concatenate(parts) if parts else np.zeros(0)


def all_iterates_statistic(per_round_deltas: Any, directions: Directions) -> np.ndarray:
  """max over rounds t of cos(Delta_t, c_k), for each direction: float64 [n].

  `per_round_deltas` is [T, d] (or a sequence of T flat vectors), each a round's model change
  oriented as in `cosines`; `directions` as in `cosines` (read once: each block meets all
  rounds). Over a long run the loop keeps this as a running maximum instead,
  `np.maximum(previous, cosines(Delta_t, directions))`, which is the same number.
  """
  deltas = np.asarray(per_round_deltas, dtype=np.float64)
  if deltas.ndim != 2 or deltas.shape[0] < 1:
    raise UserInputError(f'`per_round_deltas` must be [rounds, d] with at least one round, got '
                         f'shape {deltas.shape}')
  if not np.all(np.isfinite(deltas)):
    raise UserInputError('`per_round_deltas` contains NaN or infinity')
  norms = np.linalg.norm(deltas, axis=1)
  # Zero rounds contribute cosine 0 (as in `cosines`).
  scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)
  parts = []
  for block in _blocks(directions):
    block = np.asarray(block, dtype=np.float64)
    if block.ndim != 2 or block.shape[1] != deltas.shape[1]:
      raise UserInputError(f'`directions` must have rows of {deltas.shape[1]} entries (the size '
                           f'of a round\'s delta), got a block of shape {block.shape}')
    parts.append(((block @ deltas.T) * scale).max(axis=1))
  return np.concatenate(parts) if parts else np.zeros(0)


def _log_mass(intervals: Sequence[tuple[float, float]], mean: float, std: float) -> float:
  """log P(Y in union of disjoint `intervals`) for Y ~ N(mean, std^2), accurate in the tails
  (each interval's mass is taken from the tail it lies in, not as 1 minus something)."""
  total = -math.inf
  for low, high in intervals:
    a, b = (low - mean) / std, (high - mean) / std
    if a >= 0:     # Right of the mean: sf(a) - sf(b).
      big, small = stats.norm.logsf(a), stats.norm.logsf(b)
    elif b <= 0:   # Left of the mean: cdf(b) - cdf(a).
      big, small = stats.norm.logcdf(b), stats.norm.logcdf(a)
    else:          # Contains the mean: 1 - cdf(a) - sf(b), at least one half of the smaller.
      big, small = 0.0, float(np.logaddexp(stats.norm.logcdf(a), stats.norm.logsf(b)))
    if big == -math.inf:
      continue
    piece = big + math.log1p(-math.exp(min(small - big, 0.0))) if small < big else -math.inf
    total = float(np.logaddexp(total, piece))
  return total


def _superlevel_set(a: float, b: float, c: float) -> list[tuple[float, float]]:
  """{y : a y^2 + b y + c > 0} as disjoint open intervals (endpoints may be infinite)."""
  inf = math.inf
  if a == 0.0:
    if b == 0.0:
      return [(-inf, inf)] if c > 0 else []
    root = -c / b
    return [(root, inf)] if b > 0 else [(-inf, root)]
  disc = b * b - 4.0 * a * c
  if disc <= 0.0:   # No sign change: the whole line or nothing.
    return [(-inf, inf)] if a > 0 else []
  # Stable roots (no cancellation when a is tiny, i.e. nearly equal stds).
  q = -0.5 * (b + math.copysign(math.sqrt(disc), b))
  roots = sorted([q / a, c / q] if q != 0.0 else [-math.sqrt(-c / a), math.sqrt(-c / a)])
  if a > 0:
    return [(-inf, roots[0]), (roots[1], inf)]
  return [(roots[0], roots[1])]


def _log_hockey_stick(epsilon: float, p_mean: float, p_std: float, q_mean: float,
                      q_std: float) -> float:
  """log of sup_S Q(S) - e^epsilon P(S) for P = N(p_mean, p_std^2), Q = N(q_mean, q_std^2);
  -inf when it is 0. The sup is over S = {y : log q(y)/p(y) > epsilon}, a quadratic's
  superlevel set."""
  a = 0.5 / p_std ** 2 - 0.5 / q_std ** 2
  b = q_mean / q_std ** 2 - p_mean / p_std ** 2
  c = 0.5 * (p_mean / p_std) ** 2 - 0.5 * (q_mean / q_std) ** 2 + math.log(p_std / q_std)
  region = _superlevel_set(a, b, c - epsilon)
  log_q = _log_mass(region, q_mean, q_std)
  if log_q == -math.inf:
    return -math.inf
  gap = epsilon + _log_mass(region, p_mean, p_std) - log_q
  if gap >= 0.0:
    return -math.inf
  return log_q + math.log1p(-math.exp(gap))


def gaussian_pair_epsilon(null_mean: float, null_std: float, mean: float, std: float,
                          delta: float) -> float:
  """Epsilon at `delta` of the mechanism whose neighbouring outputs are N(`null_mean`,
  `null_std`^2) and N(`mean`, `std`^2): the smallest epsilon >= 0 at which the hockey-stick
  divergence is <= `delta` in both directions (symmetric in the two Gaussians).

  0 when it is already (0, delta); `math.inf` when a std is 0 and the distributions differ
  (a point mass against anything else is distinguishable with certainty).
  """
  delta = check_delta(delta)
  for name, value in (('null_mean', null_mean), ('mean', mean), ('null_std', null_std),
                      ('std', std)):
    if not math.isfinite(value):
      raise UserInputError(f'`{name}` must be finite, got {value}')
  if null_std < 0 or std < 0:
    raise UserInputError(f'`null_std` and `std` must be >= 0, got {null_std}, {std}')
  if null_std == 0 or std == 0:
    same = null_std == std and null_mean == mean
    return 0.0 if same else math.inf
  log_delta = math.log(delta)

  def excess(epsilon: float) -> float:
    worst = max(_log_hockey_stick(epsilon, null_mean, null_std, mean, std),
                _log_hockey_stick(epsilon, mean, std, null_mean, null_std))
    return max(worst, _LOG_ZERO) - log_delta

  if excess(0.0) <= 0:
    return 0.0
  low, high = 0.0, 1.0
  while excess(high) > 0:
    low, high = high, 2.0 * high
    if high > 1e12:
      return math.inf
  return float(optimize.brentq(excess, low, high, xtol=1e-12, rtol=1e-10))


def fit(values: np.ndarray) -> tuple[float, float]:
  """(mean, sample std) of `values`: the Gaussian fitted to canary statistics."""
  return float(values.mean()), float(values.std(ddof=1))


def epsilon_from_cosines(inserted: Any, unseen: Any, delta: float) -> CanaryEstimate:
  """Final-model estimate with an empirical null: Gaussians fitted to the inserted canaries'
  cosines and to the unseen canaries' cosines (`cosines` of the total model change), and the
  epsilon of that pair at `delta`.

  Use `epsilon_from_cosines_closed_form_null` for the paper's final-model estimate, which
  needs no unseen canaries; this one checks the null instead of assuming it (a mean away from
  0 or a std away from 1/sqrt(d) says the directions were not independent of the update).
  """
  inserted = statistics(inserted, 'inserted')
  unseen = statistics(unseen, 'unseen')
  return _estimate(inserted, *fit(unseen), unseen.size, delta)


def epsilon_from_cosines_closed_form_null(inserted: Any, dim: int,
                                          delta: float) -> CanaryEstimate:
  """The paper's final-model estimate: a Gaussian fitted to the inserted canaries' cosines
  against the closed-form null N(0, 1/`dim`) of an unseen canary's cosine (`dim` = d, the
  number of model weights the directions span; the Gaussian form of the null is what the
  paper's code uses for d >= 1000, and below that it is only approximate).
  """
  inserted = statistics(inserted, 'inserted')
  if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
    raise UserInputError(f'`dim` must be a positive integer, got {dim!r}')
  return _estimate(inserted, 0.0, 1.0 / math.sqrt(dim), 0, delta)


def all_iterates_epsilon(inserted_max: Any, unseen_max: Any, delta: float) -> CanaryEstimate:
  """All-iterates estimate: Gaussians fitted to the inserted and to the unseen canaries'
  `all_iterates_statistic` (max over rounds of the cosine), and the epsilon of that pair at
  `delta` (the null of a maximum has no simple closed form, so it is fitted, as in the paper).
  """
  inserted_max = statistics(inserted_max, 'inserted_max')
  unseen_max = statistics(unseen_max, 'unseen_max')
  return _estimate(inserted_max, *fit(unseen_max), unseen_max.size, delta)


def _estimate(inserted: np.ndarray, null_mu: float, null_sigma: float, num_unseen: int,
              delta: Any) -> CanaryEstimate:
  delta = check_delta(delta)
  mu, sigma = fit(inserted)
  epsilon = gaussian_pair_epsilon(null_mu, null_sigma, mu, sigma, delta)
  return CanaryEstimate(epsilon=epsilon, mu=mu, sigma=sigma, k=int(inserted.size),
                        null_mu=null_mu, null_sigma=null_sigma, num_unseen=int(num_unseen),
                        delta=delta)
