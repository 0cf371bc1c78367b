"""RDP of the Poisson-sampled Gaussian mechanism, vectorised over the terms of its series.

The value is the one `dp_accounting.rdp.RdpAccountant` composes for
`PoissonSampledDpEvent(q, GaussianDpEvent(z))`: dp_accounting's
`rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(q, z, orders)` (Mironov et
al. 2019, "Renyi Differential Privacy of the Sampled Gaussian Mechanism", Sections 3.3 and
3.4). That function sums the series of each order one term at a time in Python (~25 ms per
call with the default 156 orders, mostly the integer orders up to 1024), which dominates a
ledger replay whenever z differs from round to round, as it does with adaptive clipping
(float32 clips and stddevs move z in its last bits every round). This module evaluates the
same terms, with the same formulas, the same truncation rule and the same special functions,
as numpy arrays (~1 ms per call). Only the order of the floating-point additions differs,
so results agree with dp_accounting's to rounding error (tests check 1e-9 relative on
epsilon). Any order whose series does not behave as expected (non-finite value, or a signed
partial sum that is not positive) is recomputed by dp_accounting's own scalar code.
"""

import math
from typing import Sequence

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp
from scipy import special

# dp_accounting stops the fractional-order series after the first term whose log is below -30.
_FRAC_STOP_LOG = -30.0
_FRAC_FIRST_TERMS = 16  # Terms of the first chunk; each further chunk is twice as long.
_FRAC_MAX_TERMS = 1 << 16


def poisson_sampled_gaussian_rdp(q: float, noise_multiplier: float,
                                 orders: Sequence[float]) -> np.ndarray:
  """RDP at `orders` of one Poisson-sampled (rate q) Gaussian with multiplier z, per round.

  Equal to dp_accounting's `_compute_rdp_poisson_subsampled_gaussian(q, z, orders)` up to
  floating-point rounding.
  """
  q, sigma = float(q), float(noise_multiplier)
  orders = np.asarray(orders, dtype=np.float64)
  if q == 0:
    return np.zeros(len(orders))
  if sigma == 0:
    return np.full(len(orders), np.inf)
  if q == 1.0:
    return orders / (2 * sigma**2)
  rdp = np.full(len(orders), np.inf)  # Infinite orders stay inf, as in dp_accounting.
  finite = np.isfinite(orders)
  is_int = finite & (orders == np.floor(orders))
  is_frac = finite & ~is_int
  if is_int.any():
    alphas = orders[is_int]
    rdp[is_int] = _log_a_int(q, sigma, alphas.astype(np.int64)) / (alphas - 1)
  if is_frac.any():
    alphas = orders[is_frac]
    rdp[is_frac] = _log_a_frac(q, sigma, alphas) / (alphas - 1)
  bad = finite & ~np.isfinite(rdp)
  # pylint: disable=protected-access
  for k in np.flatnonzero(bad):  # Fall back to dp_accounting's scalar series.
    alpha = float(orders[k])
    rdp[k] = _dp_rdp._compute_log_a(q, sigma, alpha) / (alpha - 1)
  # pylint: enable=protected-access
  # A Renyi divergence is >= 0; rounding can leave -1e-17 where it is ~0 (q tiny), which
  # dp_accounting's compute_epsilon rejects.
  return np.maximum(rdp, 0.0)


def _log_sum_exp_segments(log_terms: np.ndarray, signs: np.ndarray,
                          starts: np.ndarray) -> np.ndarray:
  """log(sum_i sign_i exp(log_terms_i)) per segment (segments start at `starts`).

  Written as m + log1p(rest) with m the segment's largest log term and rest the other terms
  relative to it, so a sum close to 1 (log A close to 0, the small-RDP case) keeps its
  relative precision. NaN where the largest term is negative or the sum is not positive.
  """
  m = np.maximum.reduceat(log_terms, starts)
  lengths = np.diff(np.append(starts, len(log_terms)))
  m_rep = np.repeat(m, lengths)
  is_max = log_terms == m_rep
  # Exactly one maximal term per segment is taken out as the 1 of log1p(rest).
  first_max = is_max & (np.cumsum(is_max) - np.repeat(
      np.cumsum(is_max)[starts] - is_max[starts], lengths) == 1)
  scaled = np.where(first_max, 0.0, signs * np.exp(log_terms - m_rep))
  rest = np.add.reduceat(scaled, starts)
  max_sign = np.add.reduceat(np.where(first_max, signs, 0.0), starts)
  with np.errstate(invalid='ignore', divide='ignore'):
    result = m + np.log1p(rest)
  return np.where((max_sign > 0) & (rest > -1), result, np.nan)


def _log_a_int(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
  """log A_alpha for integer alphas: log sum_{i=0}^{alpha} C(alpha,i) q^i (1-q)^(alpha-i)
  exp((i^2 - i) / (2 sigma^2)), dp_accounting's `_compute_log_a_int` for every alpha at once."""
  lengths = alphas + 1
  starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
  n = np.repeat(alphas, lengths).astype(np.float64)
  i = (np.arange(int(lengths.sum())) - np.repeat(starts, lengths)).astype(np.float64)
  log_comb = special.gammaln(n + 1) - special.gammaln(i + 1) - special.gammaln(n - i + 1)
  log_terms = (log_comb + i * math.log(q) + (n - i) * math.log(1 - q)
               + (i * i - i) / (2 * (sigma**2)))
  return _log_sum_exp_segments(log_terms, np.ones_like(log_terms), starts)


def _log_erfc(x: np.ndarray) -> np.ndarray:
  return math.log(2) + special.log_ndtr(-x * 2**.5)


def _log_a_frac(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
  """log A_alpha for fractional alphas, dp_accounting's `_compute_log_a_frac` vectorised.

  Term i (i = 0, 1, ...) of each of the two series is evaluated exactly as dp_accounting
  does; an order's series includes its terms up to and including the first i at which both
  logs are below -30 (dp_accounting's stopping rule), so the same terms are summed. Terms
  are evaluated in chunks of growing size, for the orders whose series has not stopped yet.
  """
  z0 = sigma**2 * math.log(1 / q - 1) + .5
  active = np.arange(len(alphas))  # Orders whose series has not stopped yet.
  first, size = 0, _FRAC_FIRST_TERMS
  pieces = []  # (order index, term index, log_s0, log_s1, sign) of every included term.
  while active.size:
    if first >= _FRAC_MAX_TERMS:
      return np.full(len(alphas), np.nan)  # Left to dp_accounting's scalar code.
    a = alphas[active][:, None]
    i = np.arange(first, first + size, dtype=np.float64)[None, :]
    coef = special.binom(a, i)
    with np.errstate(divide='ignore'):
      log_coef = np.log(np.abs(coef))
    j = a - i
    log_t0 = log_coef + i * math.log(q) + j * math.log(1 - q)
    log_t1 = log_coef + j * math.log(q) + i * math.log(1 - q)
    log_e0 = math.log(.5) + _log_erfc((i - z0) / (math.sqrt(2) * sigma))
    log_e1 = math.log(.5) + _log_erfc((z0 - j) / (math.sqrt(2) * sigma))
    log_s0 = log_t0 + (i * i - i) / (2 * (sigma**2)) + log_e0
    log_s1 = log_t1 + (j * j - j) / (2 * (sigma**2)) + log_e1
    stopped = np.maximum(log_s0, log_s1) < _FRAC_STOP_LOG
    has_stop = stopped.any(axis=1)
    last = np.where(has_stop, np.argmax(stopped, axis=1), size - 1)  # Included.
    keep = np.arange(size)[None, :] <= last[:, None]
    rows = np.broadcast_to(active[:, None], keep.shape)[keep]
    terms = np.broadcast_to(i, keep.shape)[keep]
    pieces.append((rows, terms, log_s0[keep], log_s1[keep],
                   np.where(coef > 0, 1.0, -1.0)[keep]))
    active = active[~has_stop]
    first, size = first + size, size * 2
  rows, terms, log_s0, log_s1, signs = (np.concatenate(x) for x in zip(*pieces))
  order = np.lexsort((terms, rows))  # By order, then by term.
  starts = np.searchsorted(rows[order], np.arange(len(alphas)))
  log_a0 = _log_sum_exp_segments(log_s0[order], signs[order], starts)
  log_a1 = _log_sum_exp_segments(log_s1[order], signs[order], starts)
  return np.logaddexp(log_a0, log_a1)
