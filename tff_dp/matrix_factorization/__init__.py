"""Correlated-noise strategies for DP-FTRL, in numpy/scipy (no TensorFlow).

The matrix mechanism releases the prefix sums A x of the clipped sums x as B (C x + z) with
A = B C: each round adds the correlated noise (C^-1 z)_t. Here C is a lower-triangular Toeplitz
matrix given by its coefficients (C[t, s] = c[t - s]):

* `toeplitz`: C and C^-1 by their coefficients, products, the sensitivity of C under single and
  min-separation participation, and the error of the prefix-sum workload (one home for each
  formula).
* `blt`: buffered linear Toeplitz strategies (Dvijotham et al. 2024; McMahan, Xu & Zhang 2024):
  c_0 = 1, c_k = sum_i output_scale_i buf_decay_i^(k-1); the inverse is a BLT in closed form;
  `optimize` chooses the parameters for (rounds, min separation, max participations).
* `banded`: banded Toeplitz strategies: the banded square root of the prefix-sum matrix
  (coefficients binom(2k, k) / 4^k), column-normalized.
* `streaming`: the noise of a run one round at a time, (C^-1 z)_t for fresh draws z_t that are
  a function of (seed, round): a BLT's buffers or a banded strategy's last outputs, held once.
* `tree`: the tree's noise one round at a time (tfp's tree aggregation, plain or Honaker's
  efficient estimate, restarted every `rounds_per_tree` rounds): one node per level, held once.

Why ours: jax_privacy has these in JAX, which needs jax >= 0.7 and cannot share a process with
TFF 0.87 (tfp has the tree in TensorFlow, inside the process); the formulas are re-derived here
and tested against dense matrices, brute force and tfp's tree.
"""
