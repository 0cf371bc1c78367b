"""Lower-triangular Toeplitz strategies by their coefficients: C[t, s] = c[t - s] (t >= s).

Every quantity a strategy is judged by lives here: its inverse, its sensitivity under a
participation schedule, and the error of the prefix-sum workload A (lower-triangular ones) it
leaves, B = A C^-1.
"""

import math

import numpy as np
from scipy import linalg
from scipy import signal


def as_coefs(coefs, n: int) -> np.ndarray:
  """`coefs` as a float64 vector of length n (zero-padded or cut)."""
  c = np.zeros(n)
  given = np.asarray(coefs, dtype=np.float64)[:n]
  c[:given.size] = given
  return c


def materialize(coefs, n: int) -> np.ndarray:
  """The n x n matrix C[t, s] = c[t - s] for t >= s, 0 above the diagonal."""
  c = as_coefs(coefs, n)
  return linalg.toeplitz(c, np.zeros(n))


def multiply(coefs, x: np.ndarray) -> np.ndarray:
  """C x for x of shape (n, ...) (rows are rounds): the causal convolution of c with x."""
  x = np.asarray(x, dtype=np.float64)
  n = x.shape[0]
  c = as_coefs(coefs, n)
  return signal.lfilter(c, [1.0], x, axis=0)


def inverse_coefs(coefs, n: int) -> np.ndarray:
  """The first n coefficients of C^-1 (again lower-triangular Toeplitz): the impulse response
  of 1 / c(z). Needs c_0 != 0."""
  c = as_coefs(coefs, n)
  if c[0] == 0:
    raise ValueError('a Toeplitz strategy needs c_0 != 0 to be invertible')
  impulse = np.zeros(n)
  impulse[0] = 1.0
  return signal.lfilter([1.0], c, impulse)


def sensitivity_squared(coefs, n: int, min_separation: int = 0,
                        max_participations: int = 1) -> float:
  """max over participation patterns of ||C u||^2, u the 0/1 indicator of a client's rounds.

  Single participation (max_participations = 1): the largest column norm, column 0 for a
  Toeplitz C. Under min separation b (at most k participations, at least b rounds apart) for
  non-negative, non-increasing coefficients, the pattern {0, b, 2b, ...} (as many as fit)
  attains the maximum: <C e_i, C e_j> = sum_{m < n - max(i, j)} c_m c_{m + |i - j|} is
  non-negative and shrinks as max(i, j) and |i - j| grow, and any allowed pattern's j-th round
  is at least (j - 1) b, its gaps at least b, so the earliest pattern dominates term by term.
  Other coefficients are refused (`sensitivity_squared_brute_force` is the general form).
  """
  c = as_coefs(coefs, n)
  if max_participations <= 1:
    return float(c @ c)
  if np.any(c < 0) or np.any(np.diff(c) > 1e-12 * max(1.0, abs(c[0]))):
    raise ValueError('the min-separation sensitivity formula needs non-negative, '
                     'non-increasing coefficients')
  if min_separation < 1:
    raise ValueError('min_separation must be >= 1 with several participations')
  count = min(max_participations, math.ceil(n / min_separation))
  u = np.zeros(n)
  u[np.arange(count) * min_separation] = 1.0
  column_sum = multiply(c, u)
  return float(column_sum @ column_sum)


def sensitivity_squared_brute_force(matrix: np.ndarray, min_separation: int,
                                    max_participations: int) -> float:
  """The same maximum over every participation pattern, by enumeration (small n only)."""
  n = matrix.shape[1]
  best = 0.0

  def extend(pattern, start):
    nonlocal best
    if pattern:
      v = matrix[:, pattern].sum(axis=1)
      best = max(best, float(v @ v))
    if len(pattern) == max_participations:
      return
    for s in range(start, n):
      extend(pattern + [s], s + max(min_separation, 1))

  extend([], 0)
  return best


def prefix_sum_errors(coefs, n: int) -> tuple[float, float]:
  """(max, mean) over rounds t of ||row_t(A C^-1)||^2: the variance of the prefix-sum
  estimate's noise per unit noise (A = lower-triangular ones). A C^-1 is Toeplitz with the
  cumulative sums of C^-1's coefficients, so row t's norm^2 is a cumulative sum too."""
  b = np.cumsum(inverse_coefs(coefs, n))
  per_round = np.cumsum(b * b)
  return float(per_round[-1]), float(per_round.mean())


def loss(coefs, n: int, min_separation: int = 0, max_participations: int = 1,
         error: str = 'mean') -> float:
  """The strategy's noise in the prefix sums at a fixed privacy level: error (max or mean
  squared) x sensitivity^2."""
  max_error, mean_error = prefix_sum_errors(coefs, n)
  value = max_error if error == 'max' else mean_error
  return value * sensitivity_squared(coefs, n, min_separation, max_participations)
