"""Correlated-noise strategy math (issue 27.1) and its accounting (27.4) against independent computations written here:
dense matrices, brute force over participation patterns, closed forms, and Monte Carlo."""

import itertools

import dp_accounting
import numpy as np
import pytest
from scipy import special

from tff_dp import mechanisms
from tff_dp.accounting import correlated
from tff_dp.matrix_factorization import banded
from tff_dp.matrix_factorization import blt
from tff_dp.matrix_factorization import toeplitz

STRATEGY = blt.BLT(buf_decay=(0.9, 0.5), output_scale=(0.3, 0.2))


def _dense_toeplitz(c, n):
  """C[t, s] = c[t - s] below the diagonal, by a double loop."""
  m = np.zeros((n, n))
  for t in range(n):
    for s in range(t + 1):
      m[t, s] = c[t - s] if t - s < len(c) else 0.0
  return m


def _blt_coefs_by_definition(strategy, n):
  return [1.0] + [sum(w * th ** (k - 1) for th, w in zip(strategy.buf_decay,
                                                           strategy.output_scale))
                  for k in range(1, n)]


def _brute_force_sensitivity(matrix, b, k):
  """max ||C u||^2 over every 0/1 u with at most k ones, at least b apart."""
  n = matrix.shape[1]
  best = 0.0
  for count in range(1, k + 1):
    for rounds in itertools.combinations(range(n), count):
      if all(j - i >= b for i, j in zip(rounds, rounds[1:])):
        v = matrix[:, list(rounds)].sum(axis=1)
        best = max(best, float(v @ v))
  return best


def test_the_square_root_of_the_prefix_sum_matrix_in_closed_form():
  n = 12
  r = banded.sqrt_prefix_sum_coefs(n)
  np.testing.assert_allclose(r, [special.comb(2 * k, k) / 4 ** k for k in range(n)])
  root = _dense_toeplitz(r, n)
  np.testing.assert_allclose(root @ root, np.tril(np.ones((n, n))), atol=1e-12)
  c = banded.banded_sqrt_coefs(4)
  assert np.linalg.norm(c) == pytest.approx(1.0)
  np.testing.assert_allclose(c / c[0], r[:4])


def test_toeplitz_matrix_product_and_inverse_against_dense():
  n, rng = 9, np.random.default_rng(0)
  c = STRATEGY.coefs(n)
  np.testing.assert_allclose(c, _blt_coefs_by_definition(STRATEGY, n))
  dense = _dense_toeplitz(c, n)
  np.testing.assert_allclose(toeplitz.materialize(c, n), dense)
  x = rng.normal(size=(n, 3))
  np.testing.assert_allclose(toeplitz.multiply(c, x), dense @ x)
  inverse = np.linalg.inv(dense)
  np.testing.assert_allclose(_dense_toeplitz(toeplitz.inverse_coefs(c, n), n), inverse,
                             atol=1e-12)
  # The inverse of a BLT is a BLT, in closed form.
  np.testing.assert_allclose(_dense_toeplitz(STRATEGY.inverse().coefs(n), n), inverse,
                             atol=1e-12)


@pytest.mark.parametrize('b, k', [(1, 1), (3, 2), (2, 3), (4, 3), (5, 4)])
def test_min_separation_sensitivity_equals_brute_force(b, k):
  n = 11
  for c in (STRATEGY.coefs(n), banded.banded_sqrt_coefs(4)):
    brute = _brute_force_sensitivity(_dense_toeplitz(c, n), b, k)
    assert toeplitz.sensitivity_squared(c, n, b, k) == pytest.approx(brute, rel=1e-12)
    assert toeplitz.sensitivity_squared_brute_force(_dense_toeplitz(c, n), b, k) == (
        pytest.approx(brute, rel=1e-12))


def test_the_sensitivity_formula_refuses_increasing_coefficients():
  with pytest.raises(ValueError, match='non-increasing'):
    toeplitz.sensitivity_squared([1.0, 2.0], 5, 2, 2)


def test_prefix_sum_errors_against_dense():
  n = 10
  c = STRATEGY.coefs(n)
  b = np.tril(np.ones((n, n))) @ np.linalg.inv(_dense_toeplitz(c, n))
  rows = (b ** 2).sum(axis=1)
  assert toeplitz.prefix_sum_errors(c, n) == pytest.approx((rows.max(), rows.mean()))


def test_the_noise_stream_is_the_inverse_applied_to_fresh_draws():
  n, shape = 8, (3,)
  stream = blt.NoiseStream(STRATEGY, shape, np.random.default_rng(0))
  z = np.random.default_rng(1).standard_normal((n,) + shape)
  noise = np.stack([stream.apply(z[t]) for t in range(n)])
  inverse = np.linalg.inv(_dense_toeplitz(STRATEGY.coefs(n), n))
  np.testing.assert_allclose(noise, inverse @ z, atol=1e-12)
  # Its covariance over many draws is C^-1 C^-T (one coordinate per draw).
  draws = 40000
  stream = blt.NoiseStream(STRATEGY, (draws,), np.random.default_rng(2))
  samples = np.stack([stream.next() for _ in range(4)])
  inverse = inverse[:4, :4]
  np.testing.assert_allclose(np.cov(samples), inverse @ inverse.T, atol=0.03)


def test_the_optimizer_beats_independent_noise_and_a_grid_of_one_buffer_blts():
  n, b, k = 64, 8, 4
  strategy, loss = blt.optimize(n, b, k, max_buffers=3)
  assert strategy.is_stable()
  assert loss == pytest.approx(toeplitz.loss(strategy.coefs(n), n, b, k))
  assert loss < 0.3 * toeplitz.loss([1.0], n, b, k)   # Independent noise every round: 130.
  grid = min(toeplitz.loss(blt.BLT((theta,), (omega,)).coefs(n), n, b, k)
             for theta in np.linspace(0.05, 0.99, 48) for omega in np.linspace(0.02, 1.0, 50))
  assert loss <= grid * (1 + 1e-6)
  # The banded square root (bands = b) is within a few percent here (29.58 vs 30.28).
  assert loss < 1.05 * toeplitz.loss(banded.banded_sqrt_coefs(b), n, b, k)


def test_the_optimizer_refuses_impossible_settings():
  with pytest.raises(ValueError, match='max_buffers'):
    blt.optimize(10, max_buffers=0)


# ---------------------------------------------------------------- accounting (issue 27.4)


def _gaussian_epsilon(z, delta):
  acc = dp_accounting.rdp.RdpAccountant()
  return acc.compose(dp_accounting.GaussianDpEvent(z)).get_epsilon(delta)


def test_the_epsilon_curve_is_one_gaussian_over_the_rounds_so_far():
  n, b, k, z, delta = 10, 3, 3, 1.3, 1e-5
  c = STRATEGY.coefs(n)
  sens = [_brute_force_sensitivity(_dense_toeplitz(c, t), b, k) ** 0.5 for t in range(1, n + 1)]
  expected = [_gaussian_epsilon(z * sens[-1] / s, delta) for s in sens]
  np.testing.assert_allclose(correlated.epsilon_curve(c, n, b, k, z, delta), expected,
                             rtol=1e-9)
  assert expected[-1] == pytest.approx(_gaussian_epsilon(z, delta))


def test_calibration_meets_the_target_and_the_production_anchor():
  # Gboard es-ES DP-FTRL (google-research/federated dp_ftrl notebook): rho-zCDP 0.81, i.e.
  # z = 1 / sqrt(2 rho), is epsilon 8.90 at delta 1e-10.
  z = correlated.calibrate(8.9, 1e-10)
  assert _gaussian_epsilon(z, 1e-10) <= 8.9 < _gaussian_epsilon(z * 0.999, 1e-10)
  assert z == pytest.approx(1 / (2 * 0.81) ** 0.5, rel=5e-3)


def test_the_noise_in_the_final_prefix_sum_matches_its_theory():
  n, b, k, z, clip = 16, 4, 3, 0.9, 0.5
  found = mechanisms.get('blt').strategy(n, b, k, max_buffers=2)
  scale = z * clip * found.sensitivity_squared ** 0.5
  stream = blt.NoiseStream(blt.BLT(found.params['buf_decay'], found.params['output_scale']),
                           (50000,), np.random.default_rng(0))
  total = sum(stream.next() for _ in range(n)) * scale   # Zero updates: the sum is noise.
  assert np.std(total) == pytest.approx(correlated.noise_std_in_model(found.coefs, n, scale),
                                        rel=0.02)


def test_the_calibration_cli_prints_the_strategy_and_refuses_sampling(capsys):
  from tff_dp.accounting import __main__ as cli
  args = ['prog', '--target_epsilon=8.9', '--rounds=60', '--min_separation=10',
          '--max_participations=4', '--delta=1e-10']
  assert cli.main(args + ['--mechanism=blt']) == 0
  out = capsys.readouterr().out
  assert out.startswith('noise_multiplier=0.78') and 'buf_decay=[' in out
  assert 'output_scale=[' in out and 'sensitivity=' in out
  assert cli.main(args + ['--mechanism=bandmf']) == 0
  assert 'bands=10' in capsys.readouterr().out
  assert cli.main(args + ['--mechanism=blt', '--clients_per_round=5']) == 2
  assert 'drop --clients_per_round' in capsys.readouterr().err
