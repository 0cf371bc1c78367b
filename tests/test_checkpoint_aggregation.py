"""Tests for tff_dp.checkpoint_aggregation: arithmetic against numpy references, state round
trips, uncertainty against scipy, and DP evidence (averaged checkpoints beat the last iterate)."""

import asyncio
import json
import math

import numpy as np
import pytest
from scipy import stats

from tff_dp import checkpoint_aggregation as ca
from tff_dp.errors import UserInputError

_SHAPES = [(3, 4), (4,), ()]


def _sequence(t, seed=0, shapes=_SHAPES):
  rng = np.random.default_rng(seed)
  return [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(t)]


def _reference_new_weights(beta, schedule, t):
  """Weight of checkpoint i in Eq. (3) at arrival, written out independently per schedule."""
  if schedule == 'warmup':
    return [1.0] + [1.0 - min(beta, (1.0 + i) / (10.0 + i)) for i in range(1, t)]
  if schedule == 'constant':
    return [1.0] + [1.0 - beta] * (t - 1)
  raise ValueError(schedule)


def _reference_ema(seq, beta, schedule):
  """EMA after each prefix, as explicit convex combinations of the checkpoints."""
  out = []
  flat = [np.concatenate([np.ravel(w).astype(np.float64) for w in c]) for c in seq]
  if schedule == 'bias_corrected':
    m = np.zeros_like(flat[0])
    for t, x in enumerate(flat):
      m = beta * m + (1 - beta) * x
      out.append(m / (1 - beta ** (t + 1)) if beta > 0 else x)
    return out
  for t in range(1, len(flat) + 1):
    w = _reference_new_weights(beta, schedule, t)
    coef = np.array([w[i] * np.prod([1 - w[j] for j in range(i + 1, t)]) for i in range(t)])
    assert math.isclose(coef.sum(), 1.0, rel_tol=1e-12)
    out.append(coef @ np.stack(flat[:t]))
  return out


def _flat(weights):
  return np.concatenate([np.ravel(w).astype(np.float64) for w in weights])


# ---------------------------------------------------------------------------------------------
# Aggregates.

@pytest.mark.parametrize('schedule', ca.SCHEDULES)
@pytest.mark.parametrize('beta', [0.0, 0.5, 0.9, 0.999])
def test_ema_matches_reference(schedule, beta):
  seq = _sequence(40, seed=1)
  ref = _reference_ema(seq, beta, schedule)
  ema = ca.EMAAggregate(beta, schedule=schedule)
  assert ema.value() is None
  for t, c in enumerate(seq):
    ema.update(c)
    value = ema.value()
    assert [v.shape for v in value] == _SHAPES
    assert all(v.dtype == np.float32 for v in value)
    np.testing.assert_allclose(_flat(value), ref[t], rtol=1e-6, atol=1e-6)


def test_ema_warmup_schedule_values():
  ema = ca.EMAAggregate(0.99)
  assert ema.weight_of_latest(0) == 1.0
  assert ema.weight_of_latest(1) == pytest.approx(1 - 2 / 11)
  assert ema.weight_of_latest(50) == pytest.approx(1 - 51 / 60)
  assert ema.weight_of_latest(10_000) == pytest.approx(0.01)   # capped at beta
  assert ca.EMAAggregate(0.9, 'constant').weight_of_latest(1) == pytest.approx(0.1)
  assert ca.EMAAggregate(0.9, 'bias_corrected').weight_of_latest(1) == pytest.approx(0.1 / 0.19)


def test_ema_beta_zero_is_last_iterate():
  seq = _sequence(5)
  ema = ca.EMAAggregate(0.0)
  for c in seq:
    ema.update(c)
  np.testing.assert_array_equal(_flat(ema.value()), _flat(seq[-1]))


@pytest.mark.parametrize('k', [1, 3, 7])
def test_past_k_matches_reference(k):
  seq = _sequence(20, seed=2)
  agg = ca.PastKAverage(k)
  assert agg.value() is None
  for t, c in enumerate(seq):
    agg.update(c)
    window = np.stack([_flat(x) for x in seq[max(0, t - k + 1):t + 1]])
    np.testing.assert_allclose(_flat(agg.value()), window.mean(axis=0), rtol=1e-6, atol=1e-7)
    assert all(v.dtype == np.float32 for v in agg.value())


def _make(kind):
  if kind == 'past_k':
    return ca.PastKAverage(4)
  return ca.EMAAggregate(0.8, schedule=kind)


@pytest.mark.parametrize('kind', ['warmup', 'constant', 'bias_corrected', 'past_k'])
@pytest.mark.parametrize('saved_after', [0, 2, 9])
def test_state_round_trip_continues_identically(kind, saved_after):
  seq = _sequence(15, seed=3)
  full = _make(kind)
  for c in seq:
    full.update(c)
  first = _make(kind)
  for c in seq[:saved_after]:
    first.update(c)
  state = first.get_state()
  assert set(state) == set(_make(kind).get_state())   # same keys as a fresh aggregate
  assert all(isinstance(v, np.ndarray) for v in state.values())
  resumed = _make(kind)
  resumed.set_state({key: np.array(v) for key, v in state.items()})
  for c in seq[saved_after:]:
    resumed.update(c)
  assert resumed.count == full.count == len(seq)
  for a, b in zip(resumed.value(), full.value()):
    np.testing.assert_array_equal(a, b)
  for key, v in resumed.get_state().items():
    np.testing.assert_array_equal(v, full.get_state()[key])


def test_state_of_fresh_aggregate_round_trips():
  for agg in (ca.EMAAggregate(0.9), ca.PastKAverage(3)):
    fresh = type(agg)(agg.beta if hasattr(agg, 'beta') else agg.k)
    fresh.set_state(agg.get_state())
    assert fresh.value() is None and fresh.count == 0


def test_integer_tensors_take_latest_value():
  seq = [[np.full((2,), float(i), np.float32), np.array(i, np.int64)] for i in range(6)]
  for agg in (ca.EMAAggregate(0.5, 'constant'), ca.PastKAverage(3)):
    for c in seq:
      agg.update(c)
    value = agg.value()
    assert value[1].dtype == np.int64 and int(value[1]) == 5
  np.testing.assert_allclose(agg.value()[0], [4.0, 4.0])   # past-3 mean of 3, 4, 5


@pytest.mark.parametrize('beta', [-0.1, 1.0, 1.5, float('nan'), 'x', None])
def test_ema_rejects_bad_beta(beta):
  with pytest.raises(UserInputError):
    ca.EMAAggregate(beta)


def test_ema_rejects_bad_schedule():
  with pytest.raises(UserInputError, match='schedule'):
    ca.EMAAggregate(0.9, schedule='linear')


@pytest.mark.parametrize('k', [0, -1, 2.5, True, '3'])
def test_past_k_rejects_bad_k(k):
  with pytest.raises(UserInputError):
    ca.PastKAverage(k)


@pytest.mark.parametrize('agg', [ca.EMAAggregate(0.9), ca.PastKAverage(2)])
def test_shape_mismatches_rejected(agg):
  agg.update(_sequence(1)[0])
  with pytest.raises(UserInputError, match='shape'):
    agg.update([np.zeros((4, 3), np.float32), np.zeros(4, np.float32), np.float32(0)])
  with pytest.raises(UserInputError, match='expected 3 weight arrays'):
    agg.update([np.zeros((3, 4), np.float32)])
  with pytest.raises(UserInputError, match='flat list'):
    agg.update(np.zeros(3))


def test_set_state_rejects_other_configuration():
  ema = ca.EMAAggregate(0.9)
  ema.update(_sequence(1)[0])
  with pytest.raises(UserInputError, match='beta=0.9'):
    ca.EMAAggregate(0.99).set_state(ema.get_state())
  with pytest.raises(UserInputError, match='schedule'):
    ca.EMAAggregate(0.9, 'constant').set_state(ema.get_state())
  past = ca.PastKAverage(3)
  past.update(_sequence(1)[0])
  with pytest.raises(UserInputError, match='k=3'):
    ca.PastKAverage(4).set_state(past.get_state())


# ---------------------------------------------------------------------------------------------
# Training over aggregates: policy logic (no TFF).

def test_train_on_aggregate_select():
  seq = _sequence(6, seed=4)
  aggs = {'ema': ca.EMAAggregate(0.5, 'constant'), 'past_k': ca.PastKAverage(2)}
  policy = ca.TrainOnAggregate('past_k', start_round=3, p=2)
  for round_num, c in enumerate(seq, start=1):
    for agg in aggs.values():
      agg.update(c)
    start = policy.select(round_num, c, aggs)
    if round_num < 3:
      assert start is c
    else:
      np.testing.assert_array_equal(_flat(start), _flat(aggs['past_k'].value()))
      assert not np.array_equal(_flat(start), _flat(c))
  none = ca.TrainOnAggregate('none')
  assert none.select(100, seq[0], aggs) is seq[0]
  ema_policy = ca.TrainOnAggregate('ema')   # start_round 0: from the first round on
  assert ema_policy.is_active(1)
  np.testing.assert_array_equal(_flat(ema_policy.select(1, seq[0], aggs['ema'])),
                                _flat(aggs['ema'].value()))
  assert ema_policy.select(1, seq[0], {'ema': ca.EMAAggregate(0.5)}) is seq[0]   # no value yet


@pytest.mark.parametrize('make, match', [
    pytest.param(lambda: ca.TrainOnAggregate('swa'), 'kind', id='unknown_kind'),
    pytest.param(lambda: ca.TrainOnAggregate('ema', start_round=-1), 'tau',
                 id='negative_start_round'),
    pytest.param(lambda: ca.TrainOnAggregate('ema', p=1.0), 'beta', id='ema_beta_one'),
    pytest.param(lambda: ca.TrainOnAggregate('past_k', p=0), 'k >= 1', id='past_k_zero'),
    pytest.param(lambda: ca.TrainOnAggregate('past_k').select(
        1, [], {'ema': ca.EMAAggregate(0.9)}), '`past_k`', id='select_without_its_aggregate'),
    pytest.param(lambda: ca.TrainOnAggregate('ema', p=0.99).select(
        1, [], {'ema': ca.EMAAggregate(0.9)}), 'built with 0.9', id='select_other_beta'),
])
def test_train_on_aggregate_rejects(make, match):
  with pytest.raises(UserInputError, match=match):
    make()


def test_train_on_aggregate_makes_its_aggregate():
  assert isinstance(ca.TrainOnAggregate('past_k', p=5).make_aggregate(), ca.PastKAverage)
  assert ca.TrainOnAggregate('ema', p=0.9).make_aggregate().beta == 0.9


# ---------------------------------------------------------------------------------------------
# Uncertainty.

def _t(k, confidence=0.95):
  return stats.t.ppf(1 - (1 - confidence) / 2, k - 1)


def test_last_k_uncertainty_scalar():
  acc = np.array([0.61, 0.63, 0.60, 0.64, 0.62])
  r = ca.last_k_uncertainty(acc)
  assert r['k'] == 5
  assert r['mean'] == pytest.approx(0.62)
  assert r['variance'] == pytest.approx(np.var(acc, ddof=1)) == pytest.approx(2.5e-4)
  assert r['std'] == pytest.approx(np.std(acc, ddof=1))
  sem = stats.sem(acc)
  lo, hi = stats.t.interval(0.95, 4, loc=acc.mean(), scale=sem)
  assert r['ci_halfwidth'] == pytest.approx((hi - lo) / 2)
  assert r['ci_halfwidth'] == pytest.approx(2.7764451 * np.std(acc, ddof=1) / math.sqrt(5))
  assert r['prediction_halfwidth'] == pytest.approx(
      _t(5) * np.std(acc, ddof=1) * math.sqrt(1.2))
  r90 = ca.last_k_uncertainty(acc, confidence=0.9)
  assert r90['ci_halfwidth'] == pytest.approx(_t(5, 0.9) * sem)


def test_last_k_uncertainty_per_example():
  rng = np.random.default_rng(5)
  scores = rng.random((6, 50, 3))
  r = ca.last_k_uncertainty(scores)
  np.testing.assert_allclose(r['mean'], scores.mean(0))
  np.testing.assert_allclose(r['variance'], scores.var(0, ddof=1))
  np.testing.assert_allclose(r['std'], scores.std(0, ddof=1))
  np.testing.assert_allclose(r['ci_halfwidth'], _t(6) * stats.sem(scores, axis=0))
  assert r['summary']['mean_variance'] == pytest.approx(scores.var(0, ddof=1).mean())
  assert r['summary']['num_values'] == 150


@pytest.mark.parametrize('values,match', [
    (np.array([0.5]), 'at least 2'), (np.float64(0.5), 'scalar'),
    (np.array([0.5, np.nan]), 'NaN')])
def test_last_k_uncertainty_rejects(values, match):
  with pytest.raises(UserInputError, match=match):
    ca.last_k_uncertainty(values)


def test_last_k_uncertainty_rejects_confidence_one():
  with pytest.raises(UserInputError, match='confidence'):
    ca.last_k_uncertainty([1.0, 2.0], confidence=1.0)


def test_write_uncertainty_report(tmp_path):
  rng = np.random.default_rng(6)
  acc = rng.random(4)
  scores = rng.random((4, 20, 5))
  report = ca.write_uncertainty_report(
      str(tmp_path), accuracy=acc, prediction_scores=scores, loss=[np.nan, 1.0, 2.0],
      checkpoint_rounds=[7, 8, 9, 10], max_per_example_values=50)
  with open(tmp_path / 'uncertainty.json') as f:
    loaded = json.load(f)
  assert loaded == report
  assert loaded['checkpoint_rounds'] == [7, 8, 9, 10]
  a = loaded['statistics']['accuracy']
  assert a['variance'] == pytest.approx(np.var(acc, ddof=1))
  assert a['ci_halfwidth'] == pytest.approx(_t(4) * stats.sem(acc))
  assert a['values'] == pytest.approx(acc.tolist())
  s = loaded['statistics']['prediction_scores']
  assert s['summary']['mean_variance'] == pytest.approx(scores.var(0, ddof=1).mean())
  assert s['per_example'] is None and 'per_example_omitted' in s   # 100 values > 50
  top = s['predicted_label_score']
  labels = scores.mean(0).argmax(-1)
  top_values = scores[:, np.arange(20), labels]
  np.testing.assert_allclose(top['per_example']['variance'], top_values.var(0, ddof=1))
  assert top['per_example']['label'] == labels.tolist()
  assert 'NaN' in loaded['statistics']['loss']['skipped']
  path = tmp_path / 'u.json'
  ca.write_uncertainty_report(str(path), accuracy=acc)
  assert json.loads(path.read_text())['statistics']['accuracy']['k'] == 4


# ---------------------------------------------------------------------------------------------
# With TensorFlow / TFF.

def test_state_survives_program_state_manager(tmp_path):
  """The loop restores into the structure of *fresh* aggregates via FileProgramStateManager."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  seq = _sequence(6, seed=7)
  aggs = {'ema': ca.EMAAggregate(0.9), 'past_k': ca.PastKAverage(4)}
  full = {'ema': ca.EMAAggregate(0.9), 'past_k': ca.PastKAverage(4)}
  for c in seq[:5]:
    for a, b in zip(aggs.values(), full.values()):
      a.update(c)
      b.update(c)
  manager = tff.program.FileProgramStateManager(str(tmp_path))
  asyncio.run(manager.save({n: a.get_state() for n, a in aggs.items()}, 5))
  fresh = {'ema': ca.EMAAggregate(0.9), 'past_k': ca.PastKAverage(4)}
  loaded, version = asyncio.run(
      manager.load_latest({n: a.get_state() for n, a in fresh.items()}))
  assert version == 5
  for name, agg in fresh.items():
    agg.set_state(loaded[name])
    agg.update(seq[5])
    full[name].update(seq[5])
    for a, b in zip(agg.value(), full[name].value()):
      np.testing.assert_array_equal(a, b)


_D = 10            # features of the linear-regression task
_CLIENTS = 20
_EXAMPLES = 20


@pytest.fixture(scope='module')
def dp_task():
  """Tiny DP linear regression in TFF: noise dominates late training (seeded data)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2024)
  w_star = (rng.normal(size=_D) / math.sqrt(_D)).astype(np.float32)
  b_star = np.float32(0.5)

  def sample(n):
    x = rng.normal(size=(n, _D)).astype(np.float32)
    y = (x @ w_star + b_star + 0.1 * rng.normal(size=n)).astype(np.float32)
    return x, y[:, None]

  clients = [sample(_EXAMPLES) for _ in range(_CLIENTS)]
  datasets = [tf.data.Dataset.from_tensor_slices(c).batch(_EXAMPLES) for c in clients]
  x_test, y_test = sample(4000)
  spec = datasets[0].element_spec

  def model_fn():
    keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
        1, kernel_initializer='zeros', bias_initializer='zeros', input_shape=(_D,))])
    return tff.learning.models.from_keras_model(
        keras_model, loss=tf.keras.losses.MeanSquaredError(), input_spec=spec)

  clients_per_round = 5
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn,
      client_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=0.25),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(learning_rate=1.0),
      model_aggregator=tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
          noise_multiplier=1.0, clients_per_round=clients_per_round, clip=1.0))

  def test_loss(flat):
    pred = x_test @ flat[0] + flat[1]
    return float(np.mean((pred - y_test) ** 2))

  return dict(process=process, datasets=datasets, m=clients_per_round, test_loss=test_loss)


def _flat_weights(process, state):
  mw = process.get_model_weights(state)
  return [np.asarray(w) for w in list(mw.trainable) + list(mw.non_trainable)]


@pytest.mark.slow   # A 60-round training run: not in `make test-fast`.
def test_dp_averaged_checkpoints_beat_last_iterate(dp_task):
  """DP-FedAvg with noise std z*C/m = 0.2 per coordinate: the last iterate keeps jittering
  around the optimum, averaging checkpoints cancels much of the noise. Over the last 30 of 60
  rounds, EMA(0.9) and past-10 have >= 40% lower test loss than the last iterate (a numpy
  simulation of these dynamics gives ratios ~0.25 and < 0.46 in 2000 of 2000 seeds; the TFF DP
  noise itself cannot be seeded from here: it is drawn inside the TFF computation)."""
  process, test_loss = dp_task['process'], dp_task['test_loss']
  rng = np.random.default_rng(7)   # The client samples (this test's own stream).
  state = process.initialize()
  ema, past = ca.EMAAggregate(0.9), ca.PastKAverage(10)
  losses = {'last': [], 'ema': [], 'past_k': []}
  for round_num in range(1, 61):
    ids = rng.choice(_CLIENTS, dp_task['m'], replace=False)
    state = process.next(state, [dp_task['datasets'][i] for i in ids]).state
    weights = _flat_weights(process, state)
    ema.update(weights)
    past.update(weights)
    if round_num > 30:
      losses['last'].append(test_loss(weights))
      losses['ema'].append(test_loss(ema.value()))
      losses['past_k'].append(test_loss(past.value()))
  mean = {k: float(np.mean(v)) for k, v in losses.items()}
  assert mean['last'] > 0.1            # noise dominates: far above the 0.01 noise floor
  assert mean['ema'] < 0.6 * mean['last']
  assert mean['past_k'] < 0.6 * mean['last']


def test_train_on_aggregate_sets_start_weights_after_tau(dp_task):
  process, datasets = dp_task['process'], dp_task['datasets']
  state = process.initialize()
  aggs = {'past_k': ca.PastKAverage(3)}
  policy = ca.TrainOnAggregate('past_k', start_round=3, p=3)
  for round_num in range(1, 5):
    state = process.next(state, datasets[:dp_task['m']]).state
    weights = _flat_weights(process, state)
    aggs['past_k'].update(weights)
    start = policy.select(round_num, weights, aggs)
    if start is not weights:
      state = policy.apply(process, state, start)
    now = _flat_weights(process, state)
    if round_num < 3:
      assert start is weights
      np.testing.assert_array_equal(_flat(now), _flat(weights))
    else:
      expected = aggs['past_k'].value()
      np.testing.assert_array_equal(_flat(now), _flat(expected))
      assert np.abs(_flat(now) - _flat(weights)).max() > 1e-3
  with pytest.raises(UserInputError, match='got 1 arrays, the model has 2 trainable'):
    ca.replace_model_weights(process, state, weights[:1])
  with pytest.raises(UserInputError, match='shape'):
    ca.replace_model_weights(process, state, [np.zeros((_D + 1, 1), np.float32), weights[1]])
