"""Banded Toeplitz strategies (Choquette-Choo et al., NeurIPS 2023, arXiv 2306.08153): C has
`bands` non-zero coefficients. The banded square root of the prefix-sum matrix A keeps the
first `bands` coefficients of A's Toeplitz square root, r_k = binom(2k, k) / 4^k (r * r is the
all-ones sequence), and is column-normalized (its largest column has norm 1)."""

import numpy as np


def sqrt_prefix_sum_coefs(n: int) -> np.ndarray:
  """r_0..r_{n-1}, r_k = binom(2k, k) / 4^k, by the ratio r_k = r_{k-1} (2k - 1) / (2k)."""
  k = np.arange(1, n)
  return np.concatenate([[1.0], np.cumprod((2 * k - 1) / (2 * k))])


def banded_sqrt_coefs(bands: int) -> np.ndarray:
  """The `bands` coefficients of the column-normalized banded square root."""
  if bands < 1:
    raise ValueError('bands must be >= 1')
  r = sqrt_prefix_sum_coefs(bands)
  return r / np.linalg.norm(r)
