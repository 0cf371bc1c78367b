"""AdaDPS: preconditioner formulas, side-information sources, the preconditioned optimizer and
server-side factory, privacy invariance, and the sparse-linear evidence run through TFF."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import adadps
from tff_dp.adadps import preconditioner as precond_lib
from tff_dp.adadps import synthetic
from tff_dp.aggregators import privacy_queries
from tff_dp.aggregators.fixed import FixedClipGaussianFactory
from tff_dp.aggregators.preconditioned import PreconditionedFactory
from tff_dp.errors import UserInputError
from tff_dp.training.builders import adadps_setup

# ----------------------------------------------------------------------------- formulas


def test_frequency_multiplier_matches_reference_formula():
  freq = np.array([0.5, 0.25, 0.01, 0.0, 1e-6])
  got = precond_lib.frequency_multiplier(freq, cap=1000.0, division=2.0)
  want = np.minimum(1000.0, 0.5 / (freq + 1e-20)) / 2.0
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got[3] == pytest.approx(500.0)  # unseen token -> cap / division


def test_second_moment_multiplier():
  v = np.array([0.0, 1.0, 4.0])
  np.testing.assert_allclose(precond_lib.second_moment_multiplier(v, eps=1e-4),
                             1 / np.sqrt(v + 1e-4), rtol=1e-6)
  with pytest.raises(UserInputError):
    precond_lib.second_moment_multiplier(v, eps=0.0)


def test_rank_multiplier_is_reference_two_level_scale():
  freq = np.array([5.0, 1.0, 3.0, 0.5])
  np.testing.assert_array_equal(
      precond_lib.rank_multiplier(freq, num_frequent=2, rare_scale=200.0), [1, 200, 1, 200])


# ------------------------------------------------------------------------ side information

_SHAPES = ((6, 3), (3,))  # logistic regression: kernel [words, tags], bias [tags]
_WORDS = collections.OrderedDict(
    [('the', 600), ('a', 300), ('python', 60), ('java', 30), ('rust', 6), ('zig', 0)])
_TAGS = collections.OrderedDict([('t0', 50), ('t1', 25), ('t2', 5), ('t3', 1)])


def test_word_frequency_maps_onto_kernel_rows_and_leaves_bias_unscaled():
  info = adadps.token_frequency_side_info(_WORDS, _SHAPES)
  assert info.values[0].shape == (6, 1) and info.values[1] is None
  scales = adadps.build_scales(info, cap=50.0, division=1.0)
  counts = np.array(list(_WORDS.values()), np.float64)
  freq = counts / counts.sum()
  np.testing.assert_allclose(scales[0][:, 0], np.minimum(50, freq.max() / (freq + 1e-20)),
                             rtol=1e-5)
  assert scales[1].shape == () and scales[1] == 1.0
  full = precond_lib.expand_scales(scales, _SHAPES)
  assert full[0].shape == (6, 3) and np.all(full[0][:, 0] == full[0][:, 2])


def test_tag_frequency_maps_onto_kernel_columns():
  info = adadps.token_frequency_side_info(_TAGS, _SHAPES, axis=1)
  assert info.values[0].shape == (1, 3)
  scales = adadps.build_scales(info, cap=1e6)
  np.testing.assert_allclose(scales[0][0], [1.0, 2.0, 10.0], rtol=1e-5)


def test_explicit_vocab_order_and_mismatch():
  vocab = ['zig', 'rust', 'java', 'python', 'a', 'the']
  info = adadps.token_frequency_side_info(_WORDS, _SHAPES, vocab=vocab)
  assert info.values[0][0, 0] == 0.0 and info.values[0][-1, 0] > 0
  with pytest.raises(UserInputError):
    adadps.token_frequency_side_info(_WORDS, _SHAPES, vocab=vocab[:4])


def test_side_info_file_flat_npy_fills_the_weights_in_order(tmp_path):
  flat = np.arange(21, dtype=np.float32)
  np.save(tmp_path / 'flat.npy', flat)
  info = adadps.load_side_info_file(str(tmp_path / 'flat.npy'), _SHAPES)
  np.testing.assert_array_equal(info.values[0], flat[:18].reshape(6, 3))
  np.testing.assert_array_equal(info.values[1], flat[18:])


def test_side_info_file_broadcast_npy_scales_the_first_weight(tmp_path):
  np.save(tmp_path / 'rows.npy', np.full((6, 1), 2.0, np.float32))
  scales = adadps.build_scales(adadps.load_side_info_file(str(tmp_path / 'rows.npy'), _SHAPES))
  assert scales[0].shape == (6, 1) and scales[1] == 1.0


def test_side_info_file_npz_keys_name_weight_indices(tmp_path):
  np.savez(tmp_path / 'w.npz', **{'1': np.array([1.0, 2.0, 3.0])})
  info = adadps.load_side_info_file(str(tmp_path / 'w.npz'), _SHAPES)
  assert info.values[0] is None and info.values[1].shape == (3,)


@pytest.mark.parametrize('name, content, match', [
    pytest.param('bad.npy', np.ones((5, 3)), 'trainable weight shapes', id='npy_wrong_shape'),
    pytest.param('badkey.npz', {'kernel': np.ones((6, 3))}, 'unknown key', id='npz_unknown_key'),
    pytest.param('badshape.npz', {'arr_0': np.ones((6, 2))}, 'does not broadcast',
                 id='npz_no_broadcast'),
    pytest.param('missing.npy', None, 'not found', id='missing_file'),
])
def test_side_info_file_rejects(tmp_path, name, content, match):
  path = tmp_path / name
  if isinstance(content, dict):
    np.savez(path, **content)
  elif content is not None:
    np.save(path, content)
  with pytest.raises(UserInputError, match=match):
    adadps.load_side_info_file(str(path), _SHAPES)


def test_public_second_moment_matches_numpy():
  rng = np.random.default_rng(0)
  model = tf.keras.Sequential([tf.keras.layers.Dense(2, input_shape=(4,))])
  kernel = rng.standard_normal((4, 2)).astype(np.float32)
  bias = rng.standard_normal(2).astype(np.float32)
  model.set_weights([kernel, bias])
  batches = [(rng.standard_normal((5, 4)).astype(np.float32),
              rng.standard_normal((5, 2)).astype(np.float32)) for _ in range(3)]
  clients = [batches[:2], [collections.OrderedDict(x=batches[2][0], y=batches[2][1])]]
  info = adadps.public_second_moment_side_info(
      model, tf.keras.losses.MeanSquaredError(), clients)
  want_k, want_b = np.zeros((4, 2)), np.zeros(2)
  for x, y in batches:  # d/dW mean((xW + b - y)^2) = 2 x^T r / (n * out)
    r = x @ kernel + bias - y
    want_k += (2 * x.T @ r / r.size) ** 2
    want_b += (2 * r.sum(0) / r.size) ** 2
  np.testing.assert_allclose(info.values[0], want_k / 3, rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(info.values[1], want_b / 3, rtol=1e-4, atol=1e-7)
  scales = adadps.build_scales(info, eps=1e-3)
  np.testing.assert_allclose(scales[1], 1 / np.sqrt(want_b / 3 + 1e-3), rtol=1e-4)


# ------------------------------------------------------------------------------- optimizer


@pytest.mark.parametrize('momentum', [None, 0.9])
def test_preconditioned_sgd_step_matches_numpy(momentum):
  rng = np.random.default_rng(1)
  w = [rng.standard_normal(s).astype(np.float32) for s in _SHAPES]
  grads = [[rng.standard_normal(s).astype(np.float32) for s in _SHAPES] for _ in range(2)]
  scales = [rng.uniform(0.5, 20, (6, 1)).astype(np.float32), np.ones((), np.float32)]
  opt = adadps.build_preconditioned_sgd(0.1, scales, momentum=momentum)
  state = opt.initialize([tf.TensorSpec(s, tf.float32) for s in _SHAPES])
  assert list(opt.get_hparams(state).keys())[0] == 'learning_rate'
  weights = [tf.constant(x) for x in w]
  want, acc = [x.copy() for x in w], [np.zeros(s) for s in _SHAPES]
  for g in grads:
    state, weights = opt.next(state, weights, [tf.constant(x) for x in g])
    for i in range(2):
      pg = g[i] * scales[i]
      acc[i] = (momentum or 0.0) * acc[i] + pg
      want[i] = want[i] - 0.1 * (acc[i] if momentum else pg)
  for got, exp in zip(weights, want):
    np.testing.assert_allclose(got.numpy(), exp, rtol=1e-5, atol=1e-6)


def test_preconditioned_optimizer_rejects_mismatched_scales():
  opt = adadps.build_preconditioned_sgd(0.1, [np.ones((5, 1)), np.ones(())])
  state = opt.initialize([tf.TensorSpec(s, tf.float32) for s in _SHAPES])
  with pytest.raises(UserInputError):
    opt.next(state, [tf.zeros(s) for s in _SHAPES], [tf.zeros(s) for s in _SHAPES])
  with pytest.raises(UserInputError):
    adadps.build_preconditioned_sgd(0.1, [np.array([-1.0])])


# ---------------------------------------------------------------------- server-side factory


_VALUE_TYPE = tff.StructWithPythonType(
    [tff.TensorType(np.float32, (3, 2)), tff.TensorType(np.float32, (2,))], list)
_BIG_SCALES = [np.full((3, 1), 1000.0, np.float32), np.ones((), np.float32)]


@pytest.mark.parametrize('unscale', [False, True])
def test_preconditioned_factory_scales_before_inner_and_unscales_after(unscale):
  scales = [np.array([[1.0], [2.0], [4.0]], np.float32), np.ones((), np.float32)]
  process = PreconditionedFactory(scales, tff.aggregators.UnweightedMeanFactory(),
                                  unscale=unscale).create(_VALUE_TYPE)
  rng = np.random.default_rng(2)
  values = [[rng.standard_normal((3, 2)).astype(np.float32),
             rng.standard_normal(2).astype(np.float32)] for _ in range(3)]
  out = process.next(process.initialize(), values)
  mean = [np.mean([v[i] for v in values], axis=0) for i in range(2)]
  want = mean if unscale else [mean[0] * scales[0], mean[1]]
  for got, exp in zip(out.result, want):
    np.testing.assert_allclose(got, exp, rtol=1e-5)
  assert 'preconditioned' in out.measurements


def test_preconditioned_factory_validates_scales():
  value_type = tff.StructWithPythonType([tff.TensorType(np.float32, (3, 2))], list)
  with pytest.raises(UserInputError):
    PreconditionedFactory([np.ones((4, 1))]).create(value_type)
  with pytest.raises(UserInputError, match='zeros'):
    PreconditionedFactory([np.zeros((3, 1))], unscale=True).create(value_type)


def _client_value(seed):
  rng = np.random.default_rng(seed)
  return [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32)]


@pytest.mark.parametrize('unscale', [False, True])
def test_server_preconditioning_scales_before_clipping(unscale):
  """Scales of 1000 cannot lift a client's contribution above the clip: the wrapper scales the
  update first and the inner DP factory clips the scaled update, so the sensitivity it reports
  (the clip) holds for the preconditioned sum. Zero noise and one client: the result is the
  clipped (and, with `unscale`, unscaled) update itself."""
  value = _client_value(3)
  inner = FixedClipGaussianFactory(clip=1.0, noise_multiplier=0.0, clients_per_round=1.0)
  process = PreconditionedFactory(_BIG_SCALES, inner, unscale=unscale).create(_VALUE_TYPE)
  out = process.next(process.initialize(), [value])
  scaled = [value[0].astype(np.float64) * 1000.0, value[1].astype(np.float64)]
  norm = np.sqrt(sum(np.sum(v ** 2) for v in scaled))
  assert norm > 100   # The scaled update is far above the clip: clipping must act.
  contribution = [v / norm for v in scaled]   # Clipped to L2 norm 1 (the clip).
  want = [contribution[0] / 1000.0, contribution[1]] if unscale else contribution
  for got, exp in zip(out.result, want):
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-8)


def test_server_preconditioning_reports_the_inner_privacy_queries():
  """The wrapped factory's ledger tuples are the bare factory's, under the wrapper's path."""
  def reported(factory):
    process = factory.create(_VALUE_TYPE)
    out = process.next(process.initialize(), [_client_value(4), _client_value(5)])
    return [(q.name, q.l2_norm_clip, q.noise_stddev)
            for q in privacy_queries.find_privacy_queries(out.measurements)]
  bare = reported(FixedClipGaussianFactory(0.5, 1.5, 2.0))
  wrapped = reported(PreconditionedFactory(_BIG_SCALES, FixedClipGaussianFactory(0.5, 1.5, 2.0)))
  assert bare == [('update', 0.5, 0.75)]   # clip and z * clip, exact in float32.
  assert wrapped == [('preconditioned/update', 0.5, 0.75)]


# ------------------------------------------------------------- end-to-end through TFF (DP)

_CLIENTS_PER_ROUND = 20
_CLIP = 1.0
_NOISE = 1.0


def _dp_factory():
  return FixedClipGaussianFactory(_CLIP, _NOISE, _CLIENTS_PER_ROUND)


def _train_loss(task, client_opt, aggregator, rounds, seed=1):
  """The task's loss after `rounds` rounds of DP-FedAvg with `client_opt` and `aggregator`."""
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      task.model_fn, client_optimizer_fn=client_opt,
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0), model_aggregator=aggregator)
  state = process.initialize()
  rng = np.random.default_rng(seed)
  for _ in range(rounds):
    ids = rng.choice(task.num_clients, _CLIENTS_PER_ROUND, replace=False)
    state = process.next(state, [task.client_dataset(i) for i in ids]).state
  return task.loss(process.get_model_weights(state).trainable[0])


@pytest.fixture(scope='module')
def sparse_task():
  return synthetic.make_sparse_linear_task(seed=0)


@pytest.fixture(scope='module')
def freq_scales(sparse_task):
  shapes = adadps.weight_shapes_of(sparse_task.keras_model_fn())
  info = adadps.token_frequency_side_info(sparse_task.feature_counts, shapes)
  return adadps.build_scales(info, cap=1000.0, division=1.0)


@pytest.mark.slow
def test_client_adadps_beats_dp_fedavg_on_sparse_linear_task(sparse_task, freq_scales):
  """Same clip, noise, clients and rounds. The baseline runs at its best client learning rate
  from the grid {0.01, 0.03, 0.1, 0.3} (0.3 diverges; see benchmarks/bench_adadps.py), AdaDPS at
  0.03 (its best; 0.1 diverges with the x18 steps on rare features)."""
  rounds = 30
  initial = sparse_task.loss(np.zeros((sparse_task.num_features, 1)))
  base = _train_loss(sparse_task, tff.learning.optimizers.build_sgdm(0.1), _dp_factory(), rounds)
  ada = _train_loss(sparse_task, adadps.build_preconditioned_sgd(0.03, freq_scales),
                    _dp_factory(), rounds)
  assert ada < 0.5 * base, (ada, base, initial)
  assert ada < 0.05 * initial, (ada, initial)


# ------------------------------------------------------------------------ adadps_setup


class _FakeTask:
  """Just the Contract-3 attributes adadps_setup reads."""

  def __init__(self, task):
    self._task = task
    self.name = 'sparse'
    self.word_counts = task.feature_counts
    self.tag_counts = None
    self.keras_model_fn = task.keras_model_fn
    self.loss_fn = task.loss_fn
    self.preprocess_train = lambda ds: ds
    self.train_data = self

  def create_tf_dataset_for_client(self, cid):
    return self._task.client_dataset(int(cid))


def test_scales_for_task_word_freq_are_the_frequency_scales(sparse_task, freq_scales):
  scales = adadps_setup.scales_for_task(_FakeTask(sparse_task), 'word_freq', cap=1000.0,
                                        division=1.0)
  np.testing.assert_allclose(scales[0], freq_scales[0])


def test_scales_for_task_public_clients_scale_rare_features_up(sparse_task):
  pub = adadps_setup.scales_for_task(_FakeTask(sparse_task), 'public_clients',
                                     public_client_ids=['0', '1'], eps=1e-6)
  assert pub[0].shape == (sparse_task.num_features, 1) and np.all(pub[0] > 0)
  # Rare features have smaller gradient second moments -> larger scales.
  assert pub[0][50:].mean() > pub[0][:10].mean()


def test_scales_for_task_reads_a_file(sparse_task, tmp_path):
  np.save(tmp_path / 's.npy', np.full((sparse_task.num_features, 1), 3.0))
  scales = adadps_setup.scales_for_task(_FakeTask(sparse_task), f'file:{tmp_path / "s.npy"}')
  assert np.all(scales[0] == 3.0)


@pytest.mark.parametrize('side_info, match', [
    pytest.param('tag_freq', 'tag_counts', id='task_without_tag_counts'),
    pytest.param('bogus', 'side_info', id='unknown_side_info'),
])
def test_scales_for_task_rejects(sparse_task, side_info, match):
  with pytest.raises(UserInputError, match=match):
    adadps_setup.scales_for_task(_FakeTask(sparse_task), side_info)


def test_adadps_setup_builds_a_tff_optimizer_and_aggregator(freq_scales):
  assert isinstance(adadps_setup.client_optimizer('sgd', 0.1, freq_scales),
                    tff.learning.optimizers.Optimizer)
  assert isinstance(adadps_setup.server_aggregator(freq_scales, None),
                    tff.aggregators.UnweightedAggregationFactory)
