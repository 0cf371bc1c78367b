"""DP-FTRL (issue 15): the tree factories against TFF and numpy, shuffled participation, and the
tree accounting against dp_accounting built independently here."""

import collections
import math

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import aggregators
from tff_dp import ledger
from tff_dp import mechanisms
from tff_dp import noise_budget
from tff_dp import sampling
from tff_dp.accounting import accountant as accountant_lib
from tff_dp.accounting import calibration
from tff_dp.aggregators import noise_feed
from tff_dp.aggregators import privacy_queries
from tff_dp.aggregators import tree_aggregation
from tff_dp.errors import UserInputError
from test_aggregators import _dataset
from test_aggregators import _model_fn
from test_experiment import data_dir  # noqa: F401  (the fixture: 20 synthetic clients)

REPLACE_SPECIAL = dp_accounting.NeighboringRelation.REPLACE_SPECIAL


def _process(factory, shapes):
  """(the aggregation process of `factory` over `shapes`, its noise feed or None)."""
  process = factory.create(tff.to_type([(np.float32, list(s)) for s in shapes]))
  return process, noise_feed.for_factory(factory)


def _run(process_and_feed, rounds_values):
  """Runs the process over rounds, its noise fed if it has a feed; returns (results,
  measurements) per round."""
  process, feed = process_and_feed
  state = process.initialize()
  results, measurements = [], []
  for round_num, values in enumerate(rounds_values, start=1):
    out = process.next(feed.into(state, round_num) if feed else state, values)
    if feed:
      feed.commit(round_num)
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
  factory = aggregators.FtrlFactory(clip=clip, noise_multiplier=0.0, clients_per_round=m,
                                    rounds_per_epoch=2)
  ours, feed = _fed_avg(factory), noise_feed.for_factory(factory)
  oracle = _fed_avg(tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=m, clip=clip))
  s_ours = ours.initialize()
  s_oracle = oracle.set_model_weights(oracle.initialize(), ours.get_model_weights(s_ours))
  leaves = []
  for r in range(5):
    data = [_dataset(10 * r + c) for c in range(m)]
    out, out_oracle = ours.next(feed.into(s_ours, r + 1), data), oracle.next(s_oracle, data)
    feed.commit(r + 1)
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
  first_ours = ours.next(noise_feed.with_zero_noise(s0), [_dataset(c) for c in range(m)]).state
  first_unclipped = unclipped.next(start, [_dataset(c) for c in range(m)]).state
  assert not np.allclose(ours.get_model_weights(first_ours).trainable[0],
                         unclipped.get_model_weights(first_unclipped).trainable[0])


def test_ftrl_is_tff_tree_aggregation_with_its_noise_fed_from_beside_it():
  """The clipped mean is TFF's `tree_aggregation`'s bit for bit (noise off; the clip binds);
  with noise on, the output less that mean is the per-node stddev / m times the feed's tree
  residual (whose law is tfp's tree's: tests/test_tree_noise.py), restarted after every epoch
  of 3 rounds; the recorded tuple and leaves are the tree's."""
  shape, m, clip, z = (50,), 4, 0.7, 1.3
  rng = np.random.default_rng(3)
  data = [_clients(rng, shape, m) for _ in range(5)]
  quiet = _process(aggregators.FtrlFactory(clip=clip, noise_multiplier=0.0, rounds_per_epoch=3,
                                           clients_per_round=float(m)), [shape])
  theirs = _process(tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
      noise_multiplier=0.0, clients_per_round=float(m), l2_norm_clip=clip,
      record_specs=[tf.TensorSpec(shape, tf.float32)], noise_seed=11), [shape])
  r_quiet, _ = _run(quiet, data)
  r_theirs, _ = _run(theirs, data)
  for a, b in zip(r_quiet, r_theirs):
    np.testing.assert_array_equal(a[0], b[0])
  assert not np.allclose(r_quiet[0][0], np.mean([c[0] for c in data[0]], axis=0))
  noisy = aggregators.FtrlFactory(clip=clip, noise_multiplier=z, rounds_per_epoch=3,
                                  noise_seed=11, clients_per_round=float(m))
  r_noisy, m_noisy = _run(_process(noisy, [shape]), data)
  def draw(round_num, *node):   # The feed's draws: numpy's generator keyed by the round.
    return np.random.default_rng([11, round_num, *node]).standard_normal(shape, np.float32)
  leaf1 = draw(1)
  # Honaker's leaf-2 node (tfp's EfficientTreeAggregator): (left + right) / 2 + fresh, read
  # with weight 1 / (2 - 2^-1); the residual subtracts round 1's prefix noise.
  expected = {1: leaf1, 2: (0.5 * (leaf1 + draw(2)) + draw(2, 1)) / 1.5 - leaf1,
              4: draw(4)}   # Round 4 starts the second tree.
  for t, w in expected.items():
    np.testing.assert_allclose(r_noisy[t - 1][0] - r_quiet[t - 1][0], z * clip / m * w,
                               rtol=1e-4, atol=1e-6)
  assert [_leaf(x) for x in m_noisy] == [1, 2, 3, 1, 2]
  for x in m_noisy:
    assert _queries(x) == {'update': (pytest.approx(clip), pytest.approx(z * clip))}


def test_ftrl_without_its_feed_is_tff_tree_aggregation_until_its_epoch_restart():
  """`feed_noise=False`, same seed: bit-equal to TFF's `tree_aggregation` in epoch 1; a new
  tree from round 4."""
  shape, m = (50,), 4
  rng = np.random.default_rng(3)
  data = [_clients(rng, shape, m) for _ in range(5)]
  kw = dict(noise_multiplier=1.3, clients_per_round=float(m))
  ours = _process(aggregators.FtrlFactory(clip=0.7, rounds_per_epoch=3, noise_seed=11,
                                          feed_noise=False, **kw), [shape])
  theirs = _process(tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
      l2_norm_clip=0.7, record_specs=[tf.TensorSpec(shape, tf.float32)], noise_seed=11, **kw),
      [shape])
  assert ours[1] is None
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
    (result,), _ = _run(_process(factory, [shape]), [huge])
    assert np.linalg.norm(result[0]) == pytest.approx(clip, rel=1e-5)


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
  10, 15), each round's aggregate clips to the clip used; without epochs the process, fed or
  with the tree in its state, equals TFF's `tree_adaptive` exactly."""
  shape, m, rounds, gamma, eta = (6,), 8, 16, 0.3, 0.4
  rng = np.random.default_rng(2)
  norms = rng.lognormal(0.0, 1.0, (rounds, m))
  data = []
  for t in range(rounds):
    clients = _clients(rng, shape, m)
    for c in range(m):
      clients[c][0] *= norms[t, c] / np.linalg.norm(clients[c][0])
    data.append(clients)
  adaptive = dict(target_unclipped_quantile=gamma, clip_learning_rate=eta,
                  clipped_count_stddev=0.0)
  kw = dict(noise_multiplier=0.0, clients_per_round=float(m), restart_warmup=3,
            restart_frequency=6)
  ours = _process(aggregators.FtrlAdaptiveFactory(
      initial_clip=0.5, rounds_per_epoch=rounds_per_epoch,
      adaptive=aggregators.AdaptiveClipping(**adaptive), **kw), [shape])
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
    tff_kw = dict(kw, **adaptive, record_specs=[tf.TensorSpec(shape, tf.float32)],
                  initial_l2_norm_clip=0.5)
    theirs = _process(tff.aggregators.DifferentiallyPrivateFactory.tree_adaptive(**tff_kw),
                      [shape])
    r_theirs, _ = _run(theirs, data)
    in_state = _process(aggregators.FtrlAdaptiveFactory(
        initial_clip=0.5, adaptive=aggregators.AdaptiveClipping(**adaptive), feed_noise=False,
        **kw), [shape])
    assert in_state[1] is None
    r_in_state, _ = _run(in_state, data)
    for a, b, c in zip(results, r_theirs, r_in_state):
      np.testing.assert_array_equal(a[0], b[0])
      np.testing.assert_array_equal(c[0], b[0])


def test_adaptive_update_tree_is_fed_at_the_stddev_of_the_clip_in_use():
  """Noise on, zero updates (the estimate falls every round): each round's output is the fed
  tree residual times z_v x the clip used / m. The first round of each tree (rounds 1, 3, 6:
  restarts after warm-up 2, then every 3) is one fresh draw, round 2 Honaker's leaf-2
  residual; the clip adopted at each restart scales the new tree's noise."""
  z, m, dim, seed = 0.8, 4, 20, 5
  factory = aggregators.FtrlAdaptiveFactory(
      noise_multiplier=z, clients_per_round=float(m), initial_clip=1.0, restart_warmup=2,
      restart_frequency=3, noise_seed=seed,
      adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=0.5))
  results, measurements = _run(_process(factory, [(dim,)]),
                               [[[np.zeros(dim, np.float32)]] * m] * 6)
  clips = [float(x['clip']) for x in measurements]
  assert clips[0] == clips[1] == 1.0 and clips[1] > clips[2] == clips[4] > clips[5]

  def draw(round_num, *node):
    return np.random.default_rng([seed, round_num, *node]).standard_normal(dim, np.float32)
  expected = {1: draw(1), 2: (0.5 * (draw(1) + draw(2)) + draw(2, 1)) / 1.5 - draw(1),
              3: draw(3), 6: draw(6)}
  z_v = factory.update_noise_multiplier
  for t, w in expected.items():
    np.testing.assert_allclose(results[t - 1][0] * m, z_v * clips[t - 1] * w, rtol=1e-4,
                               atol=1e-6)
    assert _queries(measurements[t - 1])['update'] == (
        pytest.approx(clips[t - 1]), pytest.approx(z_v * clips[t - 1], rel=1e-6))
  assert [_leaf(x) for x in measurements] == [1, 2, 1, 2, 3, 1]


def test_adaptive_noise_split_and_per_node_std():
  """z splits as TFF's: update tree z_v * clip, count tree sigma_b per node; Eq. (1) gives z."""
  z, m, sigma_b, clip, dim = 0.8, 10.0, 2.0, 0.5, 20000
  factory = mechanisms.build_aggregator(
      'ftrl_adaptive', noise_multiplier=z, clients_per_round=m, clip=clip,
      adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=sigma_b))
  (result,), (measured,) = _run(_process(factory, [(dim,)]),
                                [[[np.zeros(dim, np.float32)]] * 2])
  q = _queries(measured)
  z_v = noise_budget.update_noise_multiplier(z, sigma_b)
  assert q['update'] == (pytest.approx(clip), pytest.approx(z_v * clip, rel=1e-6))
  assert q['clipped_count'] == (pytest.approx(0.5), pytest.approx(sigma_b))
  assert np.std(result[0]) * m == pytest.approx(z_v * clip, rel=0.03)
  assert noise_budget.effective_noise_multiplier(
      [s / c for c, s in q.values()]) == pytest.approx(z, rel=1e-5)


@pytest.mark.parametrize('kind', ['ftrl', 'ftrl_adaptive'])
def test_drop_in_build_unweighted_fed_avg(kind):
  aggregator = mechanisms.build_aggregator(
      kind, noise_multiplier=0.5, clients_per_round=20.0, clip=0.1)
  process, feed = _fed_avg(aggregator), noise_feed.for_factory(aggregator)
  state = process.initialize()
  out = process.next(feed.into(state, 1) if feed else state, [_dataset(1), _dataset(2)])
  queries = privacy_queries.find_privacy_queries(out.metrics['aggregator'])
  assert noise_budget.effective_noise_multiplier(
      [q.noise_stddev / q.l2_norm_clip for q in queries]) == pytest.approx(0.5, rel=1e-5)
  assert privacy_queries.find_tree_leaf(out.metrics['aggregator']) == 1


def test_tree_factories_reject_bad_settings():
  kw = dict(noise_multiplier=1.0, clients_per_round=10.0, clip=1.0)
  with pytest.raises(UserInputError, match='restart_warmup'):
    mechanisms.build_aggregator(
        'ftrl_adaptive', restart_warmup=8, restart_frequency=8,
        adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=5.0), **kw)
  with pytest.raises(UserInputError, match='does not take groups'):
    mechanisms.build_aggregator('ftrl', groups=[[0]], **kw)
  with pytest.raises(UserInputError, match='rounds_per_epoch'):
    mechanisms.build_aggregator('ftrl', rounds_per_epoch=0, **kw)
  with pytest.raises(UserInputError, match='geometrically'):
    mechanisms.build_aggregator('ftrl_adaptive', adaptive=aggregators.AdaptiveClipping(
        update_rule='linear', clipped_count_stddev=5.0), **kw)


# ------------------------------------------------------------------------------- sampler


def test_shuffled_schedule_gives_each_client_at_most_one_round_per_epoch():
  ids = [f'c{i}' for i in range(23)]
  s = sampling.ShuffledSampler(ids, 5)
  assert s.rounds_per_epoch == 4 and s.secret
  epochs = collections.defaultdict(list)
  for r in range(1, 13):
    clients = s.sample(r)
    assert len(clients) == 5 and s.sample(r) == clients
    event = s.sampling_event(r)
    assert (event.kind, event.epoch, event.sample_size) == ('shuffled', (r - 1) // 4 + 1, 5)
    epochs[event.epoch].extend(clients)
  for members in epochs.values():
    assert len(members) == len(set(members)) == 20     # Nobody twice in an epoch.
  assert len({tuple(sorted(m)) for m in epochs.values()}) == 3   # Fresh permutation per epoch.
  again = sampling.ShuffledSampler(ids, 5, key=s.key)   # A resume draws the same schedule.
  assert [again.sample(r) for r in (7, 2, 12)] == [s.sample(r) for r in (7, 2, 12)]
  other = sampling.ShuffledSampler(ids, 5)   # Another secret key: another schedule.
  assert not np.array_equal(other.permutation(1), s.permutation(1))
  seeded = [sampling.ShuffledSampler(ids, 5, seed=4).sample(r) for r in range(1, 9)]
  assert seeded == [sampling.ShuffledSampler(ids, 5, seed=4).sample(r) for r in range(1, 9)]
  assert not sampling.ShuffledSampler(ids, 5, seed=4).secret


# ------------------------------------------------------------------------------ ledger


def test_tree_records_round_trip_and_gaussian_lines_are_unchanged(tmp_path):
  event = ledger.SamplingEvent('shuffled', 100, sample_size=10, epoch=2)
  record = ledger.RoundRecord(3, event, (ledger.GaussianSumQuery('update', 1.0, 0.7),), 3)
  path = str(tmp_path / 'ledger.jsonl')
  with ledger.PrivacyLedger(path) as led:
    for r in (1, 2, 3):
      led.append(ledger.RoundRecord(r, event, record.queries, r))
  assert ledger.read_ledger(path)[2] == record
  poisson = ledger.RoundRecord(1, ledger.SamplingEvent('poisson', 10, probability=0.1), ())
  assert poisson.to_json() == {'round_num': 1, 'queries': [], 'sampling': {
      'kind': 'poisson', 'population_size': 10, 'probability': 0.1, 'sample_size': None}}
  with pytest.raises(ledger.LedgerError, match='epoch'):
    ledger.SamplingEvent('poisson', 10, probability=0.1, epoch=1)
  with pytest.raises(ledger.LedgerError, match='tree_leaf'):
    ledger.RoundRecord(1, event, (), 0)


# --------------------------------------------------------------------------- accounting


def _tree_records(schedule, z, population=1000, m=10, count_stddev=None):
  """Records of consecutive rounds: schedule = [(epoch, leaf), ...]."""
  queries = [ledger.GaussianSumQuery('update', 0.5, 0.5 * z)]
  if count_stddev is not None:
    queries.append(ledger.GaussianSumQuery('clipped_count', 0.5, count_stddev))
  return [ledger.RoundRecord(r, ledger.SamplingEvent('shuffled', population, sample_size=m,
                                                     epoch=e), tuple(queries), leaf)
          for r, (e, leaf) in enumerate(schedule, 1)]


def _direct_epsilon(z, epochs, delta):
  """dp_accounting alone: per epoch a SingleEpochTreeAggregationDpEvent(z, trees' steps)."""
  acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=REPLACE_SPECIAL)
  acc.compose(dp_accounting.ComposedDpEvent(
      [dp_accounting.SingleEpochTreeAggregationDpEvent(z, steps) for steps in epochs]))
  return acc.get_epsilon(delta)


def _schedule(epoch_trees):
  """[(epoch, leaf)] for epochs given as lists of tree sizes."""
  return [(e, leaf) for e, trees in enumerate(epoch_trees, 1) for size in trees
          for leaf in range(1, size + 1)]


def _ledger_curve(records, delta):
  return [p['epsilon_rdp'] for p in accountant_lib.epsilon_curve(
      records, delta, ('rdp', 'pld'), 'replace_special')]


@pytest.mark.parametrize('epoch_trees', [
    [[12]],                      # One epoch, one tree.
    [[4], [4], [4]],             # Three epochs, a tree each (restart at every epoch).
    [[3, 4, 1], [3, 5], [2]],    # Restarts inside epochs (tree_adaptive's warm-up/frequency).
])
def test_ledger_epsilon_equals_dp_accounting(epoch_trees):
  z, delta = 1.7, 1e-6
  records = _tree_records(_schedule(epoch_trees), z)
  curve = _ledger_curve(records, delta)
  # After every round: the completed epochs plus the current one's trees so far.
  done, expected = [], []
  for trees in epoch_trees:
    so_far = []
    for size in trees:
      for steps in range(1, size + 1):
        expected.append(_direct_epsilon(z, done + [so_far + [steps]], delta))
      so_far.append(size)
    done.append(trees)
  np.testing.assert_allclose(curve, expected, rtol=1e-9)
  assert curve[-1] > curve[0] > 0


def test_adaptive_ledger_combines_update_and_count_trees():
  z_v, sigma_b, delta = 2.0, 1.5, 1e-5
  records = _tree_records(_schedule([[3, 3], [6]]), z_v, count_stddev=sigma_b)
  z = (z_v**-2 + (sigma_b / 0.5)**-2)**-0.5
  assert _ledger_curve(records, delta)[-1] == pytest.approx(
      _direct_epsilon(z, [[3, 3], [6]], delta), rel=1e-9)
  # The same by composing the two trees' events, as dp_accounting would without Eq. (1).
  acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=REPLACE_SPECIAL)
  for zz in (z_v, sigma_b / 0.5):
    acc.compose(dp_accounting.ComposedDpEvent([
        dp_accounting.SingleEpochTreeAggregationDpEvent(zz, [3, 3]),
        dp_accounting.SingleEpochTreeAggregationDpEvent(zz, 6)]))
  assert _ledger_curve(records, delta)[-1] == pytest.approx(acc.get_epsilon(delta), rel=1e-9)


def test_tree_accounting_refuses_what_it_cannot_analyse():
  z, delta = 1.0, 1e-6
  ok = _tree_records(_schedule([[2], [2]]), z)
  acc = accountant_lib.LedgerAccountant(delta, ('rdp', 'pld'), 'replace_special')
  for r in ok:
    acc.add(r)
  assert acc.epsilon()['pld'] is None and acc.epsilon_pld() is None   # PLD: not applicable.
  spans = _tree_records([(1, 1), (1, 2), (2, 3)], z)   # No restart at the epoch boundary.
  with pytest.raises(UserInputError, match='restart at every epoch'):
    accountant_lib.epsilon_curve(spans, delta, ('rdp',), 'replace_special')
  with pytest.raises(UserInputError, match='replace_special'):
    accountant_lib.epsilon_curve(ok, delta, ('rdp',), 'add_remove')
  poisson = [ledger.RoundRecord(1, ledger.SamplingEvent('poisson', 100, probability=0.1),
                                ok[0].queries, 1)]
  with pytest.raises(UserInputError, match='use `client_sampling=shuffled`'):
    accountant_lib.epsilon_curve(poisson, delta, ('rdp',), 'replace_special')
  gaussian_shuffled = [ledger.RoundRecord(1, ok[0].sampling, ok[0].queries)]
  with pytest.raises(UserInputError, match='independent Gaussian noise has no proof with '
                     'shuffled sampling'):
    accountant_lib.epsilon_curve(gaussian_shuffled, delta, ('rdp',), 'add_remove')
  replayed = ok[:2] + [ok[1]]   # Round 2 recorded again after a resume.
  with pytest.raises(UserInputError, match='re-executed'):
    accountant_lib.epsilon_curve(replayed, delta, ('rdp',), 'replace_special')
  assert accountant_lib.default_relation(ok) == 'replace_special'


def test_tree_calibration_reaches_the_target_with_dp_accounting():
  """--mechanism=tree: 1600 rounds of 100 of 342477 clients (one epoch, the paper's DP-FTRL
  StackOverflow setting) and two epochs of a small population."""
  delta = 1e-6
  for rounds, population, target in ((1600, 342477, 8.2), (30, 200, 5.0)):
    result = calibration.calibrate_noise_multiplier(
        target, delta, rounds, population_size=population, clients_per_round=100 if
        population > 1000 else 10, mechanism='tree')
    per_epoch = population // (100 if population > 1000 else 10)
    epochs = [per_epoch] * (rounds // per_epoch) + (
        [rounds % per_epoch] if rounds % per_epoch else [])
    assert result.neighboring_relation == 'replace_special'
    assert _direct_epsilon(result.noise_multiplier, [[s] for s in epochs], delta) <= target
    assert _direct_epsilon(result.noise_multiplier * 0.999, [[s] for s in epochs],
                           delta) > target
  with pytest.raises(UserInputError, match='use rdp'):
    calibration.calibrate_noise_multiplier(8.0, delta, 10, population_size=100,
                                           clients_per_round=10, mechanism='tree',
                                           method='pld')


# ------------------------------------------------------------------ runs (CLI wiring)


def _experiment(data_dir, root, name, **overrides):
  """A DP-FTRL run on 20 synthetic clients, 5 per round (epochs of 4 rounds)."""
  import csv  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import tasks  # pylint: disable=g-import-not-at-top
  from tff_dp.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_dp.training import experiment  # pylint: disable=g-import-not-at-top
  cfg = dict(root_output_dir=str(root), experiment_name=name, task='stackoverflow_tag',
             total_rounds=6,
             clients_per_round=5, dp='ftrl', clip=1.0, noise_multiplier=0.8,
             client_sampling='shuffled', rounds_per_checkpoint=1, server_momentum=0.9,
             max_eval_examples=50, accounting=('rdp', 'pld'), seed=3, sampling_seed=5,
             delta=1e-5)
  cfg.update(overrides)
  task = tasks.build_task('stackoverflow_tag', data_dir, client_batch_size=8, shuffle_seed=0,
                          word_vocab_size=200, tag_vocab_size=30)
  summary = experiment.run(config_lib.ExperimentConfig.from_settings(cfg), task,
                           log=lambda s: None)
  with open(os.path.join(summary.run_dir, 'metrics.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  records = ledger.read_ledger(os.path.join(summary.run_dir, 'ledger.jsonl'))
  return summary, rows, records


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_ftrl_run_records_trees_epochs_and_epsilon(data_dir, tmp_path):
  import os  # pylint: disable=g-import-not-at-top
  import stat  # pylint: disable=g-import-not-at-top
  summary, rows, records = _experiment(data_dir, tmp_path, 'ftrl', sampling_seed=None)
  assert [r.tree_leaf for r in records] == [1, 2, 3, 4, 1, 2]
  assert [r.sampling.epoch for r in records] == [1, 1, 1, 1, 2, 2]
  # The executed per-node multiplier (float32 stddev / clip, as recorded) is what counts.
  (query,) = records[0].queries
  z = query.noise_stddev / query.l2_norm_clip
  assert z == pytest.approx(0.8, rel=1e-6)
  expected = [_direct_epsilon(z, epochs, 1e-5) for epochs in (
      [[1]], [[2]], [[3]], [[4]], [[4], [1]], [[4], [2]])]
  np.testing.assert_allclose([float(r['epsilon_rdp']) for r in rows], expected, rtol=1e-9)
  assert all(r['epsilon_pld'] == '' for r in rows)   # PLD: not applicable.
  privacy = summary.privacy
  assert privacy['neighboring_relation'] == 'replace_special'
  assert 'replace-special' in privacy['guarantee'] and 'n/a (PLD)' in privacy['guarantee']
  key = os.path.join(summary.run_dir, 'secret', 'sampling_key')
  assert stat.S_IMODE(os.stat(key).st_mode) == 0o600


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_max_epsilon_stops_a_tree_run_before_the_round_that_would_exceed_it(data_dir, tmp_path):
  """`max_epsilon` predicts the next round's tree event (the next leaf of this epoch's tree, or a
  new tree at an epoch boundary) and stops before it; the cap lies between two rounds' epsilons
  computed with dp_accounting alone (epochs of 4 rounds: 20 clients, 5 per round)."""
  schedule = ([[1]], [[2]], [[3]], [[4]], [[4], [1]], [[4], [2]])
  curve = [_direct_epsilon(0.8, epochs, 1e-5) for epochs in schedule]
  last = next(r for r in range(1, 6) if curve[r] > curve[r - 1])   # Rounds kept: 1..last.
  cap = (curve[last - 1] + curve[last]) / 2
  summary, rows, records = _experiment(data_dir, tmp_path, 'capped', max_epsilon=cap)
  assert summary.stopped_by_max_epsilon and summary.rounds_completed == last
  assert len(rows) == len(records) == last
  assert float(rows[-1]['epsilon_rdp']) == pytest.approx(curve[last - 1], rel=1e-6)
  assert float(rows[-1]['epsilon_rdp']) <= cap


def test_ftrl_refuses_poisson_sampling_with_one_line(data_dir, tmp_path):
  with pytest.raises(UserInputError, match=r'^tree-aggregation noise .* use '
                     r'`client_sampling=shuffled`, or `dp=fixed\|adaptive\|'):
    _experiment(data_dir, tmp_path, 'poisson', client_sampling='poisson')
  with pytest.raises(UserInputError, match='rounds_per_checkpoint=1'):
    _experiment(data_dir, tmp_path, 'ckpt', rounds_per_checkpoint=2)


@pytest.mark.parametrize('dp', ['ftrl', 'ftrl_adaptive'])
@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_resume_mid_tree_gives_the_same_model_and_epsilon_curve(dp, data_dir, tmp_path,
                                                                monkeypatch):
  """Stopped after round 3 (inside the first tree) and resumed to round 6, with noise on and
  both runs given one noise seed: the trees' noise (in the checkpointed aggregator state), the
  samples and the server optimizer continue, so the model, the tree leaves and the epsilon
  curve are the uninterrupted run's."""
  monkeypatch.setattr(tree_aggregation, 'noise_seed', lambda seed: 77)
  kw = dict(dp=dp, restart_warmup=2, restart_frequency=3, noise_multiplier=0.8,
            clipped_count_stddev=1.0)
  full, full_rows, full_records = _experiment(data_dir, tmp_path, 'full', **kw)
  _experiment(data_dir, tmp_path, 'part', total_rounds=3, **kw)
  resumed, rows, records = _experiment(data_dir, tmp_path, 'part', resume=True, **kw)
  assert [r.tree_leaf for r in records] == [r.tree_leaf for r in full_records]
  for a, b in zip(full.final_state.global_model_weights.trainable,
                  resumed.final_state.global_model_weights.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert [r['eval_accuracy'] for r in rows] == [r['eval_accuracy'] for r in full_rows]
  # The resumed accountant continued exactly: its column is the replay of its ledger, and the
  # uninterrupted run's curve (the same noise gives ftrl_adaptive the same clips).
  replay = [p['epsilon_rdp'] for p in accountant_lib.epsilon_curve(
      records, 1e-5, ('rdp',), 'replace_special')]
  assert [float(r['epsilon_rdp']) for r in rows] == replay
  assert replay == [float(r['epsilon_rdp']) for r in full_rows]


def test_command_line_flags_reach_the_checks(tmp_path):
  """run_experiment.py: the new choices and flags exist, and a refused combination is one
  `error:` line naming the flag to use (exit code 2)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  from run_helpers import script  # pylint: disable=g-import-not-at-top
  from run_helpers import script_env  # pylint: disable=g-import-not-at-top
  common = ['--clip=1', '--noise_multiplier=1', f'--root_output_dir={tmp_path}']
  for args, message in (
      (['--dp=ftrl'], 'use --client_sampling=shuffled'),
      (['--dp=ftrl_adaptive', '--client_sampling=shuffled', '--rounds_per_checkpoint=1',
        '--restart_warmup=3', '--restart_frequency=3'], '--restart_warmup (3) must be smaller'),
  ):
    proc = subprocess.run(script('run_experiment.py') + common + args, env=script_env(),
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith('error:')]
    assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], proc.stderr


@pytest.mark.parametrize('relation', ['replace_special', 'add_remove'])
def test_one_ledger_holds_one_mechanism(relation):
  """A ledger's first record chooses its mechanism's accountant; a record of another mechanism
  is refused whichever comes first (tree rounds then Gaussian rounds, or the reverse)."""
  tree = _tree_records(_schedule([[2]]), 1.0)
  gaussian = ledger.RoundRecord(3, ledger.SamplingEvent('poisson', 1000, probability=0.01,
                                                   probability_given=True),
                                tree[0].queries)
  acc = accountant_lib.LedgerAccountant(1e-6, ('rdp',), relation)
  first, second = (tree[0], gaussian) if relation == 'replace_special' else (gaussian, tree[0])
  acc.add(first)
  before = acc.epsilon_rdp()
  with pytest.raises(UserInputError, match='one ledger holds one mechanism'):
    acc.add(second)
  assert before > 0
