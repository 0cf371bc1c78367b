"""Tests of the DP aggregation factories run as real TFF AggregationProcesses."""

import collections
import math

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp import aggregators
from tff_dp import mechanisms
from tff_dp.aggregators import estimate_floor
from tff_dp.aggregators import privacy_queries
from tff_dp.errors import UserInputError


def _process(factory, shapes):
  return factory.create(tff.to_type([(np.float32, list(s)) for s in shapes]))


def _clients(rng, shapes, num, norms=None):
  """`num` client values (lists of tensors); each tensor's norm is norms[c][t] if given."""
  out = []
  for c in range(num):
    value = []
    for t, s in enumerate(shapes):
      v = rng.normal(size=s).astype(np.float32)
      if norms is not None:
        v *= norms[c][t] / np.linalg.norm(v)
      value.append(v)
    out.append(value)
  return out


def _combined_z(multipliers):
  """Eq. (1), written out here rather than taken from the code under test: queries with noise
  multipliers z_g on the same sample act as one Gaussian with z = (sum_g z_g^-2)^-1/2."""
  return sum(float(z)**-2 for z in multipliers)**-0.5


def _queries(measurements):
  return {q.name: (q.l2_norm_clip, q.noise_stddev)
          for q in privacy_queries.find_privacy_queries(measurements)}


# ---------------------------------------------------------------- flat adaptive vs TFF / tfp


def test_flat_adaptive_clip_trajectory_equals_tff_and_tfp():
  rounds, m, shape = 20, 5, (4,)
  rng = np.random.default_rng(0)
  data = [_clients(rng, [shape], m, norms=rng.lognormal(0.0, 1.0, (m, 1))) for _ in range(rounds)]
  kwargs = dict(clients_per_round=float(m), target_unclipped_quantile=0.3)
  ours = _process(aggregators.AdaptiveClipGaussianFactory(
      noise_multiplier=0.0, initial_clip=0.5, clients_per_round=float(m),
      adaptive=aggregators.AdaptiveClipping(target_unclipped_quantile=0.3,
                                            clip_learning_rate=0.3)), [shape])
  theirs = _process(tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
      noise_multiplier=0.0, initial_l2_norm_clip=0.5, learning_rate=0.3, **kwargs), [shape])
  query = tfp.QuantileAdaptiveClipSumQuery(
      initial_l2_norm_clip=0.5, noise_multiplier=0.0, target_unclipped_quantile=0.3,
      learning_rate=0.3, clipped_count_stddev=0.0, expected_num_records=float(m),
      geometric_update=True)
  s_ours, s_theirs, q_state = ours.initialize(), theirs.initialize(), query.initial_global_state()
  ours_clips, theirs_clips, tfp_clips = [], [], []
  for values in data:
    out = ours.next(s_ours, values)
    s_ours = out.state
    ours_clips.append(float(out.measurements['next_clip']))
    out_t = theirs.next(s_theirs, values)
    s_theirs = out_t.state
    theirs_clips.append(float(out_t.measurements['dp_query_metrics']['clip']))
    np.testing.assert_allclose(out.result[0], out_t.result[0], rtol=1e-5, atol=1e-7)
    params = query.derive_sample_params(q_state)
    sample = query.initial_sample_state(tf.TensorSpec(shape, tf.float32))
    for v in values:
      sample = query.accumulate_record(params, sample, v[0])
    _, q_state, _ = query.get_noised_result(sample, q_state)
    tfp_clips.append(float(q_state.sum_state.l2_norm_clip))
  np.testing.assert_allclose(ours_clips, theirs_clips, rtol=1e-6)
  np.testing.assert_allclose(ours_clips, tfp_clips, rtol=1e-5)
  assert len(set(np.round(ours_clips, 5))) > 5  # The clip actually moved.


@pytest.mark.slow   # An 80-round process: not in `make test-fast`.
def test_flat_factory_converges_to_median_from_100x_too_small():
  """The real factory: clip goes from 100x below the median of client norms to within 10%."""
  m = 50
  rng = np.random.default_rng(1)
  process = _process(aggregators.AdaptiveClipGaussianFactory(
      noise_multiplier=0.0, clients_per_round=float(m), initial_clip=0.01,
      adaptive=aggregators.AdaptiveClipping(clip_learning_rate=0.5,
                                            clipped_count_stddev=0.0)), [(2,)])
  state = process.initialize()
  tail = []
  for r in range(80):
    norms = rng.lognormal(0.0, 0.5, (m, 1))  # Median 1.
    out = process.next(state, _clients(rng, [(2,)], m, norms))
    state = out.state
    if r >= 60:
      tail.append(float(out.measurements['next_clip']))
  assert np.mean(tail) == pytest.approx(1.0, rel=0.1)
  assert tail[-1] == pytest.approx(1.0, rel=0.15)


@pytest.mark.parametrize('update_rule', ['geometric', 'linear'])
def test_direction_all_clipped_grows_none_clipped_shrinks(update_rule):
  process = _process(aggregators.AdaptiveClipGaussianFactory(
      noise_multiplier=0.0, clients_per_round=4.0, initial_clip=1.0,
      adaptive=aggregators.AdaptiveClipping(update_rule=update_rule)), [(3,)])
  rng = np.random.default_rng(2)
  state = process.initialize()
  big = process.next(state, _clients(rng, [(3,)], 4, [[10.0]] * 4))
  small = process.next(state, _clients(rng, [(3,)], 4, [[0.1]] * 4))
  assert float(big.measurements['next_clip']) > 1.0
  assert float(small.measurements['next_clip']) < 1.0
  assert float(big.measurements['unclipped_fraction_estimate']) == pytest.approx(0.0, abs=1e-5)
  assert float(small.measurements['unclipped_fraction_estimate']) == pytest.approx(1.0, abs=1e-5)
  if update_rule == 'geometric':
    assert float(big.measurements['next_clip']) == pytest.approx(math.exp(0.2 * 0.5))
  else:
    assert float(big.measurements['next_clip']) == pytest.approx(1.0 + 0.2 * 0.5)


def test_privacy_queries_report_pre_round_clip_and_stddev():
  z, m, sigma_b = 0.5, 10.0, 1.0
  factory = aggregators.AdaptiveClipGaussianFactory(
      noise_multiplier=z, clients_per_round=m, initial_clip=1.0,
      adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=sigma_b))
  z_v = (z**-2 - (2 * sigma_b)**-2)**-0.5   # Eq. (1) solved for the update query.
  process = _process(factory, [(3,)])
  rng = np.random.default_rng(3)
  state = process.initialize()
  out1 = process.next(state, _clients(rng, [(3,)], 10, [[5.0]] * 10))
  q1 = _queries(out1.measurements)
  assert q1['update'] == pytest.approx((1.0, z_v))
  assert q1['clipped_count'] == pytest.approx((0.5, sigma_b))
  clip_after_1 = float(out1.measurements['next_clip'])
  assert clip_after_1 != pytest.approx(1.0)
  out2 = process.next(out1.state, _clients(rng, [(3,)], 10, [[5.0]] * 10))
  q2 = _queries(out2.measurements)
  assert q2['update'] == pytest.approx((clip_after_1, z_v * clip_after_1), rel=1e-6)
  assert float(out2.measurements['clip']) == pytest.approx(clip_after_1)
  # Eq. (1) over the reported tuples gives back the user's effective z.
  assert _combined_z([s / c for c, s in q2.values()]) == pytest.approx(z, rel=1e-5)


def test_fixed_reports_tuple_and_matches_tff():
  process = _process(aggregators.FixedClipGaussianFactory(0.5, 0.0, 3.0), [(3,)])
  theirs = _process(tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(0.0, 3.0, 0.5),
                    [(3,)])
  values = _clients(np.random.default_rng(4), [(3,)], 3, [[2.0], [0.1], [0.4]])
  out = process.next(process.initialize(), values)
  out_t = theirs.next(theirs.initialize(), values)
  np.testing.assert_allclose(out.result[0], out_t.result[0], rtol=1e-6)
  assert _queries(out.measurements) == {'update': pytest.approx((0.5, 0.0))}
  noised = _process(aggregators.FixedClipGaussianFactory(0.5, 1.2, 3.0), [(3,)])
  q = _queries(noised.next(noised.initialize(), values).measurements)
  assert q['update'] == pytest.approx((0.5, 0.6))


# ---------------------------------------------------------------- per-layer and joint


def test_per_layer_clips_track_their_own_layer_quantile():
  m, shapes = 40, [(5,), (3,)]
  rng = np.random.default_rng(5)
  process = _process(aggregators.PerLayerAdaptiveClipFactory(
      noise_multiplier=0.0, clients_per_round=float(m), initial_clip=1.0,
      adaptive=aggregators.AdaptiveClipping(clip_learning_rate=0.5)), shapes)
  state = process.initialize()
  tails = collections.defaultdict(list)
  for r in range(60):
    norms = np.stack([rng.lognormal(np.log(0.1), 0.3, m), rng.lognormal(np.log(10.0), 0.3, m)],
                     axis=1)
    out = process.next(state, _clients(rng, shapes, m, norms))
    state = out.state
    if r >= 40:
      for name, v in out.measurements['next_clip'].items():
        tails[name].append(float(v))
  assert np.mean(tails['group_0']) == pytest.approx(0.1, rel=0.1)
  assert np.mean(tails['group_1']) == pytest.approx(10.0, rel=0.1)
  q = _queries(out.measurements)
  assert set(q) == {'update/group_0', 'update/group_1', 'clipped_count/group_0',
                    'clipped_count/group_1'}
  assert q['update/group_0'][0] == pytest.approx(tails['group_0'][-2], rel=1e-5)


def test_per_layer_groups_split_the_noise_budget():
  shapes = [(10,), (2,), (100,)]
  factory = aggregators.PerLayerAdaptiveClipFactory(
      noise_multiplier=0.5, clients_per_round=20.0, initial_clip=[1.0, 2.0],
      groups=[[0, 1], [2]], noise_allocation='dimensionality',
      adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=2.0))
  process = _process(factory, shapes)
  out = process.next(process.initialize(), _clients(np.random.default_rng(6), shapes, 2))
  q = _queries(out.measurements)
  z_v = (0.5**-2 - 2 * (2 * 2.0)**-2)**-0.5   # Two clipped-count queries, one per group.
  assert q['update/group_0'] == pytest.approx((1.0, z_v * math.sqrt(112 / 12) * 1.0), rel=1e-6)
  assert q['update/group_1'] == pytest.approx((2.0, z_v * math.sqrt(112 / 100) * 2.0), rel=1e-6)
  assert _combined_z([s / c for c, s in q.values()]) == pytest.approx(0.5, rel=1e-5)


def test_per_layer_groups_must_partition_the_weights():
  with pytest.raises(UserInputError, match='partition'):
    _process(aggregators.PerLayerAdaptiveClipFactory(
        noise_multiplier=0.0, clients_per_round=2.0, initial_clip=1.0, groups=[[0], [0, 1]]),
             [(2,), (2,)])


def test_joint_scales_clip_and_unscale():
  shapes = [(3,), (2,)]
  process = _process(aggregators.JointClipFactory(
      noise_multiplier=0.0, clients_per_round=1.0, initial_scale=[1.0, 10.0],
      adaptive_scales=False, joint_clip=1.0), shapes)
  v = [np.array([3.0, 0.0, 4.0], np.float32), np.array([0.0, 50.0], np.float32)]
  out = process.next(process.initialize(), [v])
  # Scaled: (3, 0, 4) and (0, 5): joint norm sqrt(50); clip to 1, unscale by alpha.
  f = 1 / math.sqrt(50)
  np.testing.assert_allclose(out.result[0], np.array([3, 0, 4]) * f, rtol=1e-5)
  np.testing.assert_allclose(out.result[1], np.array([0, 50]) * f, rtol=1e-5)
  assert _queries(out.measurements) == {'update/group_0': pytest.approx((1.0, 0.0))}


def test_joint_adaptive_scales_track_per_vector_quantiles():
  m, shapes = 40, [(4,), (2,)]
  rng = np.random.default_rng(7)
  process = _process(aggregators.JointClipFactory(
      noise_multiplier=0.0, clients_per_round=float(m), initial_scale=1.0,
      adaptive=aggregators.AdaptiveClipping(clip_learning_rate=0.5)), shapes)
  state = process.initialize()
  tails = collections.defaultdict(list)
  for r in range(50):
    norms = np.stack([rng.lognormal(np.log(0.1), 0.3, m), rng.lognormal(np.log(10.0), 0.3, m)],
                     axis=1)
    out = process.next(state, _clients(rng, shapes, m, norms))
    state = out.state
    if r >= 30:
      for name, value in out.measurements['next_scale'].items():
        tails[name].append(float(value))
  assert np.mean(tails['tensor_0']) == pytest.approx(0.1, rel=0.1)
  assert np.mean(tails['tensor_1']) == pytest.approx(10.0, rel=0.1)
  q = _queries(out.measurements)
  assert q['update/group_0'] == pytest.approx((math.sqrt(2), 0.0))
  assert q['clipped_count/group_0/tensor_1'] == pytest.approx((0.5, 0.0))


def _floored_estimate_reference(norms, alpha, gamma, eta, geometric, floor):
  """numpy: the next clips or scales from this round's per-client norms [m, k] (no noise): b_j
  is the fraction of ||v_j|| <= alpha_j, then tfp's linear or geometric step, then the floor;
  in float32 like TF, so the linear steps round alike."""
  alpha, eta, gamma = np.float32(alpha), np.float32(eta), np.float32(gamma)
  b = np.mean(norms <= alpha, axis=0).astype(np.float32)
  update = eta * (b - gamma)
  step = alpha * np.exp(-update) if geometric else alpha - update
  return np.maximum(step, np.float32(floor))


def _joint_sum_reference(values, alpha, joint_clip, m):
  """numpy: sum over clients of v_j / alpha_j jointly clipped to S, times alpha_j, over m."""
  out = [np.zeros_like(t, np.float64) for t in values[0]]
  for value in values:
    scaled = [np.float64(t) / a for t, a in zip(value, alpha)]
    norm = np.sqrt(sum(np.sum(t**2) for t in scaled))
    factor = joint_clip / max(norm, joint_clip)
    for j, t in enumerate(scaled):
      out[j] += t * factor * alpha[j] / m
  return out


@pytest.mark.parametrize('rule,eta,rounds', [
    # Tiny updates: unfloored, alpha 1 -> .75 -> .5 -> .25 -> 0 exactly, then a NaN round.
    ('linear', 0.5, 10),
    # Tensor 1's updates are all zero: unfloored, alpha * e^-5 per round underflows to 0 and
    # stays there.
    ('geometric', 10.0, 25),
])
def test_joint_adaptive_scales_stay_positive(rule, eta, rounds):
  m, shapes, gamma = 4, [(3,), (2,)], 0.5
  rng = np.random.default_rng(9)
  process = _process(aggregators.JointClipFactory(
      noise_multiplier=0.0, clients_per_round=float(m), initial_scale=1.0,
      adaptive=aggregators.AdaptiveClipping(clip_learning_rate=eta,
                                            target_unclipped_quantile=gamma,
                                            update_rule=rule)), shapes)
  state = process.initialize()
  alpha = np.array([1.0, 1.0], np.float32)
  tensor_1_norm = 0.0 if rule == 'geometric' else 1e-3
  norms = np.array([[1e-3 * (c + 1), tensor_1_norm] for c in range(m)])
  values = _clients(rng, shapes, m, norms)
  lowest = 1.0
  for r in range(rounds):
    out = process.next(state, values)
    state = out.state
    used = np.array([float(out.measurements['scale'][f'tensor_{j}']) for j in range(2)])
    new = np.array([float(out.measurements['next_scale'][f'tensor_{j}']) for j in range(2)])
    np.testing.assert_allclose(used, alpha, rtol=1e-4, err_msg=f'round {r}')
    assert np.all(used > 0) and np.all(new > 0), (r, used, new)
    for got, want in zip(out.result, _joint_sum_reference(values, alpha, math.sqrt(2), m)):
      assert np.all(np.isfinite(got)), (r, used)
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-12)
    alpha = _floored_estimate_reference(norms, alpha, gamma, eta, rule == 'geometric',
                                        estimate_floor.MIN_ESTIMATE)
    np.testing.assert_allclose(new, alpha, rtol=1e-4, err_msg=f'round {r}')
    lowest = min(lowest, float(np.min(alpha)))
  assert lowest == np.float32(estimate_floor.MIN_ESTIMATE)   # The floor was reached.


def _group_clipped_mean_reference(values, groups, clips, m):
  """numpy: sum over clients of each group of tensors clipped (jointly) to its clip, over m."""
  out = [np.zeros_like(t, np.float64) for t in values[0]]
  for value in values:
    for g, clip in zip(groups, clips):
      norm = np.sqrt(sum(np.sum(np.float64(value[i])**2) for i in g))
      factor = np.float64(clip) / max(norm, np.float64(clip))
      for i in g:
        out[i] += np.float64(value[i]) * factor / m
  return out


@pytest.mark.parametrize('kind', ['adaptive', 'per_layer_adaptive'])
def test_adaptive_clips_stay_positive_under_linear_rule(kind):
  """tfp steps the linear-rule clip 1 -> .75 -> .5 -> .25 -> 0 for tiny updates (and group 1 of
  per_layer_adaptive, from .6, to -.15, i.e. clip 0); clipping the zero client to 0 is 0/0, so
  unfloored every round from then on is NaN. Floored: finite, and the clips follow numpy."""
  m, shapes, gamma, eta = 2, [(3,), (2,)], 0.5, 0.5
  if kind == 'adaptive':
    groups, clip = [[0, 1]], np.array([1.0], np.float32)
    factory = aggregators.AdaptiveClipGaussianFactory(
        noise_multiplier=0.0, clients_per_round=float(m), initial_clip=1.0,
        adaptive=aggregators.AdaptiveClipping(
            target_unclipped_quantile=gamma, clip_learning_rate=eta, update_rule='linear',
            clipped_count_stddev=0.0))
  else:
    groups, clip = [[0], [1]], np.array([1.0, 0.6], np.float32)
    factory = aggregators.PerLayerAdaptiveClipFactory(
        noise_multiplier=0.0, clients_per_round=float(m), initial_clip=[1.0, 0.6],
        adaptive=aggregators.AdaptiveClipping(
            target_unclipped_quantile=gamma, clip_learning_rate=eta, update_rule='linear',
            clipped_count_stddev=0.0))
  process = _process(factory, shapes)
  # One client sends 1e-3-sized updates, the other all zeros (as TFF sends for a client whose
  # update it zeroed for being non-finite).
  values = _clients(np.random.default_rng(10), shapes, m, [[1e-3, 2e-3], [0.0, 0.0]])
  norms = np.array([[np.sqrt(sum(np.sum(np.float64(v[i])**2) for i in g)) for g in groups]
                    for v in values])

  def per_group(measurement):
    if kind == 'adaptive':
      return np.array([float(measurement)])
    return np.array([float(measurement[f'group_{g}']) for g in range(len(groups))])

  floor = np.float32(estimate_floor.MIN_ESTIMATE)
  state = process.initialize()
  for r in range(10):
    out = process.next(state, values)
    state = out.state
    used = per_group(out.measurements['clip'])
    np.testing.assert_allclose(used, clip, rtol=1e-6, err_msg=f'round {r}')
    assert np.all(used >= floor), (r, used)
    # The ledger's tuple is the clip this round used.
    q = _queries(out.measurements)
    reported = ([q['update'][0]] if kind == 'adaptive' else
                [q[f'update/group_{g}'][0] for g in range(len(groups))])
    np.testing.assert_allclose(reported, used, rtol=1e-6)
    for got, want in zip(out.result, _group_clipped_mean_reference(values, groups, clip, m)):
      assert np.all(np.isfinite(got)), (r, used)
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-12)
    b = np.mean(norms <= clip, axis=0)
    next_clip = _floored_estimate_reference(norms, clip, gamma, eta, False, floor)
    np.testing.assert_allclose(per_group(out.measurements['next_clip']), next_clip, rtol=1e-6,
                               err_msg=f'round {r}')
    # The reported b inverts the step: exact, except where the floor bound (understated).
    binds = clip - eta * (b - gamma) < floor
    fraction = np.where(binds, gamma + (clip - next_clip) / eta, b)
    assert np.all(fraction <= b + 1e-6)
    np.testing.assert_allclose(per_group(out.measurements['unclipped_fraction_estimate']),
                               fraction, atol=1e-5)
    clip = next_clip
  np.testing.assert_array_equal(clip, floor)   # Every clip reached the floor and stayed.


# ---------------------------------------------------------------- sensitivity and noise


def test_single_client_contribution_is_bounded_by_its_clip():
  shapes = [(20,), (7,)]
  rng = np.random.default_rng(8)
  huge = _clients(rng, shapes, 1, [[1e3, 1e4]])
  norm = lambda x: float(np.linalg.norm(np.concatenate([np.ravel(t) for t in x])))

  flat = _process(aggregators.AdaptiveClipGaussianFactory(
      noise_multiplier=0.0, clients_per_round=1.0, initial_clip=0.7), shapes)
  assert norm(flat.next(flat.initialize(), huge).result) == pytest.approx(0.7, rel=1e-5)

  per_layer = _process(aggregators.PerLayerAdaptiveClipFactory(
      noise_multiplier=0.0, clients_per_round=1.0, initial_clip=[0.3, 2.0]), shapes)
  out = per_layer.next(per_layer.initialize(), huge).result
  assert np.linalg.norm(out[0]) == pytest.approx(0.3, rel=1e-5)
  assert np.linalg.norm(out[1]) == pytest.approx(2.0, rel=1e-5)

  joint = _process(aggregators.JointClipFactory(
      noise_multiplier=0.0, clients_per_round=1.0, initial_scale=[0.5, 4.0],
      joint_clip=1.2), shapes)
  out = joint.next(joint.initialize(), huge).result
  scaled = math.sqrt(np.sum((out[0] / 0.5)**2) + np.sum((out[1] / 4.0)**2))
  assert scaled == pytest.approx(1.2, rel=1e-5)


@pytest.mark.parametrize('kind', ['fixed', 'adaptive', 'per_layer_adaptive', 'joint'])
def test_noise_std_matches_configuration(kind):
  """All-zero updates: the aggregate is pure noise / m; 20000 draws estimate its std to ~0.5%."""
  z, m, sigma_b, clip = 0.8, 10.0, 2.0, 0.5
  shapes = [(12000,), (8000,)]
  factory = mechanisms.build_aggregator(
      kind, noise_multiplier=z, clients_per_round=m, clip=clip,
      adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=sigma_b))
  process = _process(factory, shapes)
  zeros = [[np.zeros(s, np.float32) for s in shapes]] * 2
  out = process.next(process.initialize(), zeros)
  q = _queries(out.measurements)
  # Eq. (1) solved for the update query: one clipped-count query (flat adaptive) or two.
  z_v1 = (z**-2 - (2 * sigma_b)**-2)**-0.5
  z_v2 = (z**-2 - 2 * (2 * sigma_b)**-2)**-0.5
  if kind == 'fixed':
    expected = [z * clip] * 2
  elif kind == 'adaptive':
    expected = [z_v1 * clip] * 2
  elif kind == 'per_layer_adaptive':   # Two groups, proportional: z_g = z_v sqrt(2).
    expected = [z_v2 * math.sqrt(2) * clip] * 2
  else:  # Joint: one group, S = sqrt(2), alpha_j = clip; noise alpha_j * sigma_g.
    expected = [clip * z_v2 * math.sqrt(2)] * 2
  for t in range(2):
    assert np.std(out.result[t]) * m == pytest.approx(expected[t], rel=0.05)
    assert abs(np.mean(out.result[t])) * m < 0.05 * expected[t]
  # The reported tuples combine (Eq. (1)) to the user's effective z.
  assert _combined_z([s / c for c, s in q.values()]) == pytest.approx(z, rel=1e-5)


# ---------------------------------------------------------------- builder and drop-in


def test_build_aggregator_rejects_bad_combinations():
  kw = dict(noise_multiplier=1.0, clients_per_round=10.0, clip=1.0)
  with pytest.raises(UserInputError, match='unknown DP aggregation'):
    mechanisms.build_aggregator('bogus', **kw)
  with pytest.raises(UserInputError, match='clipped_count_stddev` above 0.5'):
    mechanisms.build_aggregator(   # sigma_b = z / 2.
        'adaptive', adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=0.5), **kw)
  # The default sigma_b is m / 20 = 0.5 raised to z = 1 (issue 25): z_v = z * 2 / sqrt(3).
  assert mechanisms.build_aggregator('adaptive', **kw).update_noise_multiplier == (
      pytest.approx(2 / 3 ** 0.5))
  with pytest.raises(UserInputError, match='does not take groups'):
    mechanisms.build_aggregator('fixed', groups=[[0]], **kw)
  with pytest.raises(UserInputError, match='update rule'):
    mechanisms.build_aggregator('adaptive', adaptive=aggregators.AdaptiveClipping(
        update_rule='cubic', clipped_count_stddev=5.0), **kw)
  with pytest.raises(UserInputError, match='noise_allocation'):
    mechanisms.build_aggregator('per_layer_adaptive', noise_allocation='x', **kw)
  with pytest.raises(UserInputError, match='target_unclipped_quantile'):
    mechanisms.build_aggregator(
        'joint', adaptive=aggregators.AdaptiveClipping(target_unclipped_quantile=1.5), **kw)
  with pytest.raises(UserInputError, match='clipped_count_stddev` above'):
    mechanisms.build_aggregator(
        'per_layer_adaptive', groups=[[0], [1]],
        adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=0.6), **kw)


def _model_fn():
  keras_model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(4,)),
      tf.keras.layers.Dense(5, activation='relu'),
      tf.keras.layers.Dense(3)])
  return tff.learning.models.from_keras_model(
      keras_model, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32)))


def _dataset(seed):
  rng = np.random.default_rng(seed)
  return tf.data.Dataset.from_tensor_slices(
      (rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
  ).batch(4)


@pytest.mark.parametrize('kind', ['fixed', 'adaptive', 'per_layer_adaptive', 'joint'])
def test_drop_in_build_unweighted_fed_avg(kind):
  aggregator = mechanisms.build_aggregator(
      kind, noise_multiplier=0.5, clients_per_round=20.0, clip=0.1)
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      _model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.1),
      model_aggregator=aggregator)
  state = process.initialize()
  before = process.get_model_weights(state).trainable
  out = process.next(state, [_dataset(1), _dataset(2)])
  after = process.get_model_weights(out.state).trainable
  assert any(not np.allclose(a, b) for a, b in zip(after, before))
  queries = privacy_queries.find_privacy_queries(out.metrics['aggregator'])
  assert queries and all(q.l2_norm_clip > 0 for q in queries)
  assert _combined_z([q.noise_stddev / q.l2_norm_clip for q in queries]) == pytest.approx(
      0.5, rel=1e-5)
