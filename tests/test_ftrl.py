"""DP-FTRL (issue 15): the tree factories against TFF and numpy, shuffled participation, and the
tree accounting against dp_accounting built independently here."""

import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import aggregators
from tff_dp import noise_budget
from tff_dp.aggregators import privacy_queries
from tff_dp.errors import UserInputError
from test_aggregators import _dataset
from test_aggregators import _model_fn


def _process(factory, shapes):
  return factory.create(tff.to_type([(np.float32, list(s)) for s in shapes]))


def _run(process, rounds_values):
  """Runs `process` over rounds; returns (results, measurements) per round."""
  state = process.initialize()
  results, measurements = [], []
  for values in rounds_values:
    out = process.next(state, values)
    state = out.state
    results.append([np.asarray(t) for t in out.result])
    measurements.append(out.measurements)
  return results, measurements


def _leaf(measurements):
  return privacy_queries.find_tree_leaf(measurements)


def _queries(measurements):
  return {q.name: (q.l2_norm_clip, q.noise_stddev)
          for q in privacy_queries.find_privacy_queries(measurements)}


def _clients(rng, shape, num, scale=1.0):
  return [[(scale * rng.normal(size=shape)).astype(np.float32)] for _ in range(num)]


# ------------------------------------------------------------------------------ factories


def _fed_avg(aggregator):
  return tff.learning.algorithms.build_unweighted_fed_avg(
      _model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
      model_aggregator=aggregator)


def test_noise_zero_ftrl_is_fed_avg_with_the_same_clip_round_by_round():
  """DP-FTRLM with z = 0 is FedAvg (server momentum) over clipped updates: TFF's fixed-clip
  factory with z = 0 is the oracle, compared after every round (the clip binds)."""
  clip, m = 0.05, 3
  ours = _fed_avg(aggregators.FtrlFactory(clip=clip, noise_multiplier=0.0,
                                          clients_per_round=m, rounds_per_epoch=2))
  oracle = _fed_avg(tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=m, clip=clip))
  s_ours = ours.initialize()
  s_oracle = oracle.set_model_weights(oracle.initialize(), ours.get_model_weights(s_ours))
  leaves = []
  for r in range(5):
    data = [_dataset(10 * r + c) for c in range(m)]
    out, out_oracle = ours.next(s_ours, data), oracle.next(s_oracle, data)
    s_ours, s_oracle = out.state, out_oracle.state
    leaves.append(_leaf(out.metrics['aggregator']))
    for a, b in zip(ours.get_model_weights(s_ours).trainable,
                    oracle.get_model_weights(s_oracle).trainable):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  assert leaves == [1, 2, 1, 2, 1]   # Restarted after every epoch of 2 rounds.
  # The clip binds: without it the first round moves the model elsewhere.
  unclipped = _fed_avg(tff.aggregators.UnweightedMeanFactory())
  s0 = ours.initialize()
  start = unclipped.set_model_weights(unclipped.initialize(), ours.get_model_weights(s0))
  first_ours = ours.next(s0, [_dataset(c) for c in range(m)]).state
  first_unclipped = unclipped.next(start, [_dataset(c) for c in range(m)]).state
  assert not np.allclose(ours.get_model_weights(first_ours).trainable[0],
                         unclipped.get_model_weights(first_unclipped).trainable[0])


def test_ftrl_is_tff_tree_aggregation_until_its_epoch_restart():
  """Same seed: bit-equal to TFF's `tree_aggregation` in epoch 1; a new tree from round 4."""
  shape, m = (50,), 4
  rng = np.random.default_rng(3)
  data = [_clients(rng, shape, m) for _ in range(5)]
  kw = dict(noise_multiplier=1.3, clients_per_round=float(m))
  ours = _process(aggregators.FtrlFactory(clip=0.7, rounds_per_epoch=3, noise_seed=11, **kw),
                  [shape])
  theirs = _process(tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
      l2_norm_clip=0.7, record_specs=[tf.TensorSpec(shape, tf.float32)], noise_seed=11, **kw),
      [shape])
  r_ours, m_ours = _run(ours, data)
  r_theirs, _ = _run(theirs, data)
  for t in range(3):
    np.testing.assert_array_equal(r_ours[t][0], r_theirs[t][0])
  assert not np.allclose(r_ours[3][0], r_theirs[3][0])
  assert [_leaf(x) for x in m_ours] == [1, 2, 3, 1, 2]
  for x in m_ours:
    assert _queries(x) == {'update': (pytest.approx(0.7), pytest.approx(1.3 * 0.7))}


def _honaker_node_variance(level, sigma):
  """Variance of the efficient (Honaker 2015) estimate of a complete subtree's sum at height
  `level`, each node noised with stddev sigma: combine the node with its two children."""
  v = sigma**2
  for _ in range(level):
    v = 1.0 / (1.0 / sigma**2 + 1.0 / (2.0 * v))
  return v


@pytest.mark.parametrize('use_efficient', [True, False])
def test_per_node_std_and_prefix_sum_noise_match_the_recorded_tuple(use_efficient):
  """All-zero updates: the outputs are pure noise. Round 1's output is one leaf's noise (the
  per-node stddev); the sum of the first t outputs is the tree's noise on the prefix sum t,
  whose variance is that of the complete subtrees making up [1, t] (one per 1-bit of t).
  20000 coordinates estimate each std to ~0.5%."""
  z, clip, m, dim, rounds = 0.9, 0.5, 10.0, 20000, 7
  process = _process(aggregators.FtrlFactory(clip=clip, noise_multiplier=z, clients_per_round=m,
                                             use_efficient=use_efficient), [(dim,)])
  zeros = [[np.zeros(dim, np.float32)]] * 2
  results, measurements = _run(process, [zeros] * rounds)
  (recorded_clip, sigma), = _queries(measurements[0]).values()
  assert recorded_clip == pytest.approx(clip) and sigma == pytest.approx(z * clip)
  assert np.std(results[0][0] * m) == pytest.approx(sigma, rel=0.03)
  prefix = np.cumsum([r[0] * m for r in results], axis=0)
  for t in range(1, rounds + 1):
    levels = [d for d in range(t.bit_length()) if t >> d & 1]
    if use_efficient:
      expected = sum(_honaker_node_variance(d, sigma) for d in levels)
    else:
      expected = len(levels) * sigma**2
    assert np.var(prefix[t - 1]) == pytest.approx(expected, rel=0.05), t
    assert abs(np.mean(prefix[t - 1])) < 0.05 * sigma
  assert [_leaf(x) for x in measurements] == list(range(1, rounds + 1))


def test_each_client_contribution_is_bounded_by_the_clip():
  shape = (30,)
  rng = np.random.default_rng(5)
  huge = _clients(rng, shape, 1, scale=1e3)
  for factory, clip in (
      (aggregators.FtrlFactory(clip=0.3, noise_multiplier=0.0, clients_per_round=1.0), 0.3),
      (aggregators.FtrlAdaptiveFactory(noise_multiplier=0.0, clients_per_round=1.0,
                                       initial_clip=0.8, restart_warmup=1,
                                       restart_frequency=2), 0.8)):
    process = _process(factory, [shape])
    out = process.next(process.initialize(), huge)
    assert np.linalg.norm(out.result[0]) == pytest.approx(clip, rel=1e-5)


def _adaptive_reference(norms, initial_clip, gamma, eta, restart_after):
  """Clip used and estimate after each round (numpy): the estimate takes a geometric step on
  the fraction of norms <= the current estimate every round; the clip adopts the estimate
  only after the rounds in `restart_after` (TFF's tree_adaptive documentation)."""
  clip, estimate, used, estimates = initial_clip, initial_clip, [], []
  for t, round_norms in enumerate(norms, 1):
    used.append(clip)
    below = float(np.mean(round_norms <= estimate))
    estimate = estimate * math.exp(-eta * (below - gamma))
    estimates.append(estimate)
    if t in restart_after:
      clip = estimate
  return used, estimates


@pytest.mark.parametrize('rounds_per_epoch', [None, 5])
def test_adaptive_clip_follows_quantile_and_is_adopted_at_restarts(rounds_per_epoch):
  """Noise off: the estimate tracks the target quantile every round, the clip used changes only
  at restarts (after warm-up 3, then every 6 rounds, and with epochs of 5 also after rounds 5,
  10, 15), each round's aggregate clips to the clip used; without epochs the process equals
  TFF's `tree_adaptive` exactly."""
  shape, m, rounds, gamma, eta = (6,), 8, 16, 0.3, 0.4
  rng = np.random.default_rng(2)
  norms = rng.lognormal(0.0, 1.0, (rounds, m))
  data = []
  for t in range(rounds):
    clients = _clients(rng, shape, m)
    for c in range(m):
      clients[c][0] *= norms[t, c] / np.linalg.norm(clients[c][0])
    data.append(clients)
  kw = dict(noise_multiplier=0.0, clients_per_round=float(m), restart_warmup=3,
            restart_frequency=6, target_unclipped_quantile=gamma, clip_learning_rate=eta,
            clipped_count_stddev=0.0)
  ours = _process(aggregators.FtrlAdaptiveFactory(initial_clip=0.5,
                                                  rounds_per_epoch=rounds_per_epoch, **kw),
                  [shape])
  results, measurements = _run(ours, data)
  restarts = {3, 9, 15} | ({5, 10, 15} if rounds_per_epoch else set())
  used, estimates = _adaptive_reference(norms, 0.5, gamma, eta, restarts)
  leaves, leaf = [], 0
  for t in range(1, rounds + 1):
    leaf += 1
    leaves.append(leaf)
    if t in restarts:
      leaf = 0
  assert [_leaf(x) for x in measurements] == leaves
  for t, x in enumerate(measurements):
    assert float(x['clip']) == pytest.approx(used[t], rel=1e-5)
    assert _queries(x)['update'][0] == pytest.approx(used[t], rel=1e-5)
    assert float(x['dp_query_metrics']['estimate_clip']) == pytest.approx(estimates[t], rel=1e-4)
    clipped = sum(v[0] * min(1.0, used[t] / np.linalg.norm(v[0])) for v in data[t])
    np.testing.assert_allclose(results[t][0] * m, clipped, rtol=1e-4, atol=1e-6)
  assert len(set(np.round(used, 6))) >= 3   # The clip really moved at restarts.
  if rounds_per_epoch is None:
    tff_kw = dict(kw, record_specs=[tf.TensorSpec(shape, tf.float32)], initial_l2_norm_clip=0.5)
    theirs = _process(tff.aggregators.DifferentiallyPrivateFactory.tree_adaptive(**tff_kw),
                      [shape])
    r_theirs, _ = _run(theirs, data)
    for a, b in zip(results, r_theirs):
      np.testing.assert_array_equal(a[0], b[0])


def test_adaptive_noise_split_and_per_node_std():
  """z splits as TFF's: update tree z_v * clip, count tree sigma_b per node; Eq. (1) gives z."""
  z, m, sigma_b, clip, dim = 0.8, 10.0, 2.0, 0.5, 20000
  factory = aggregators.build_dp_aggregator(
      'ftrl_adaptive', noise_multiplier=z, clients_per_round=m, clip=clip,
      clipped_count_stddev=sigma_b)
  process = _process(factory, [(dim,)])
  out = process.next(process.initialize(), [[np.zeros(dim, np.float32)]] * 2)
  q = _queries(out.measurements)
  z_v = noise_budget.update_noise_multiplier(z, sigma_b)
  assert q['update'] == (pytest.approx(clip), pytest.approx(z_v * clip, rel=1e-6))
  assert q['clipped_count'] == (pytest.approx(0.5), pytest.approx(sigma_b))
  assert np.std(out.result[0]) * m == pytest.approx(z_v * clip, rel=0.03)
  assert noise_budget.effective_noise_multiplier(
      [s / c for c, s in q.values()]) == pytest.approx(z, rel=1e-5)


@pytest.mark.parametrize('kind', ['ftrl', 'ftrl_adaptive'])
def test_drop_in_build_unweighted_fed_avg(kind):
  aggregator = aggregators.build_dp_aggregator(
      kind, noise_multiplier=0.5, clients_per_round=20.0, clip=0.1)
  process = _fed_avg(aggregator)
  state = process.initialize()
  out = process.next(state, [_dataset(1), _dataset(2)])
  queries = privacy_queries.find_privacy_queries(out.metrics['aggregator'])
  assert noise_budget.effective_noise_multiplier(
      [q.noise_stddev / q.l2_norm_clip for q in queries]) == pytest.approx(0.5, rel=1e-5)
  assert privacy_queries.find_tree_leaf(out.metrics['aggregator']) == 1


def test_tree_factories_reject_bad_settings():
  kw = dict(noise_multiplier=1.0, clients_per_round=10.0, clip=1.0)
  with pytest.raises(UserInputError, match='restart_warmup'):
    aggregators.build_dp_aggregator('ftrl_adaptive', clipped_count_stddev=5.0, restart_warmup=8,
                                    restart_frequency=8, **kw)
  with pytest.raises(UserInputError, match='does not take groups'):
    aggregators.build_dp_aggregator('ftrl', groups=[[0]], **kw)
  with pytest.raises(UserInputError, match='rounds_per_epoch'):
    aggregators.build_dp_aggregator('ftrl', rounds_per_epoch=0, **kw)
  with pytest.raises(UserInputError, match='geometrically'):
    aggregators.build_dp_aggregator('ftrl_adaptive', update_rule='linear',
                                    clipped_count_stddev=5.0, **kw)
