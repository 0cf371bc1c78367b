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
from tff_dp.matrix_factorization import streaming
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


def _run(stream, z, state=None):
  """The stream's outputs for the rows of z (each round's draws), and its last state."""
  state = stream.start(z.shape[1], z.dtype) if state is None else state
  out = []
  for row in z:
    w, state = stream.advance(state, row)
    out.append(w)
  return np.stack(out), state


@pytest.mark.parametrize('strategy', ['blt', 'banded', 'independent'])
def test_the_noise_stream_is_the_inverse_applied_to_fresh_draws(strategy):
  n, d = 9, 5
  if strategy == 'blt':
    stream, coefs = streaming.Stream(STRATEGY.buf_decay, STRATEGY.output_scale), STRATEGY.coefs(n)
  else:
    coefs = banded.banded_sqrt_coefs(4 if strategy == 'banded' else 1)
    stream = streaming.Stream(coefs=tuple(coefs))
  z = np.random.default_rng(1).standard_normal((n, d))
  noise, last = _run(stream, z)
  dense = _dense_toeplitz(np.pad(coefs, (0, n - len(coefs))), n)
  np.testing.assert_allclose(noise, np.linalg.solve(dense, z), atol=1e-12)
  assert last.step == n and len(last.buffers) == stream.num_buffers
  # Pure: a state already used advances again to the same noise (a round fed twice).
  first, after_one = stream.advance(stream.start(d, z.dtype), z[0])
  again, _ = stream.advance(stream.start(d, z.dtype), z[0])
  np.testing.assert_array_equal(first, again)
  # Resumed from the state after 4 rounds: the uninterrupted noise.
  _, mid = _run(stream, z[:4])
  np.testing.assert_allclose(_run(stream, z[4:], mid)[0], noise[4:], atol=1e-12)


def test_a_banded_stream_keeps_one_new_array_per_round():
  """Its state is its last bands - 1 outputs; advancing shares all but the newest, so the
  state of a completed round and of a round in flight cost one model copy more than one."""
  stream = streaming.Stream(coefs=tuple(banded.banded_sqrt_coefs(5)))
  state = stream.start(3)
  for row in np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32):
    w, nxt = stream.advance(state, row)
    assert nxt.buffers[0] is w and all(a is b for a, b in zip(nxt.buffers[1:], state.buffers))
    assert w.dtype == np.float32 and all(b.dtype == np.float32 for b in nxt.buffers)
    state = nxt


def test_fresh_draws_are_a_function_of_the_seed_and_the_round():
  a = streaming.fresh_draws(7, 3, 1000)
  np.testing.assert_array_equal(a, streaming.fresh_draws(7, 3, 1000))
  assert a.dtype == np.float32 and abs(np.std(a) - 1) < 0.1
  for other in (streaming.fresh_draws(7, 4, 1000), streaming.fresh_draws(8, 3, 1000)):
    assert abs(np.corrcoef(a, other)[0, 1]) < 0.15


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


@pytest.mark.parametrize('schedule', [(200, 20, 10), (150, 15, 10)])
def test_the_optimizer_keeps_no_buffer_that_buys_nothing(schedule):
  """Issue 51.6: `--target_epsilon 2 --rounds 200 --min_separation 20 --max_participations 10`
  printed buf_decay [8.3e-06, 0.91190, 0.91183], two buffers for one time scale; (150, 15, 10)
  gave twins 0.88378, 0.88378 where one buffer holds them (its own fit had stalled at scale 1,
  loss 120.9 against 105.97). Each kept buffer has its own decay; with one buffer the loss is
  the brute-force grid's best, and with more, one buffer (the grid) loses more than the
  optimizer's tolerance."""
  n, b, k = schedule
  strategy, loss = blt.optimize(n, b, k, max_buffers=4)
  decays = sorted(strategy.buf_decay)
  assert all(later - earlier > 1e-3 for earlier, later in zip(decays, decays[1:])), decays
  one_buffer = min(toeplitz.loss(blt.BLT((theta,), (omega,)).coefs(n), n, b, k)
                   for theta in np.linspace(0.5, 0.995, 100)
                   for omega in np.linspace(0.05, 1.0, 39))
  if strategy.num_buffers == 1:
    assert loss <= one_buffer * (1 + 1e-6)
  else:
    assert loss < one_buffer * (1 - blt.BUFFER_GAIN)


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
  stream = streaming.Stream(tuple(found.params['buf_decay']), tuple(found.params['output_scale']))
  z = np.random.default_rng(0).standard_normal((n, 50000))
  total = _run(stream, z)[0].sum(axis=0) * scale   # Zero updates: the sum is noise.
  assert np.std(total) == pytest.approx(correlated.noise_std_in_model(found.coefs, n, scale),
                                        rel=0.02)


def test_the_calibration_cli_prints_the_strategy_and_refuses_sampling(capsys):
  from tff_dp.accounting import __main__ as cli
  args = ['prog', '--target_epsilon=8.9', '--rounds=40', '--min_separation=10',
          '--max_participations=4', '--delta=1e-10']
  assert cli.main(args + ['--mechanism=blt']) == 0
  out = capsys.readouterr().out
  assert out.startswith('noise_multiplier=0.78') and 'buf_decay=[' in out
  assert 'output_scale=[' in out and 'sensitivity=' in out
  assert cli.main(args + ['--mechanism=bandmf']) == 0
  assert 'bands=10' in capsys.readouterr().out
  assert cli.main(args + ['--mechanism=blt', '--clients_per_round=5']) == 2
  assert 'drop --clients_per_round' in capsys.readouterr().err
