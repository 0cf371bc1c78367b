"""A tripwire on the dependency: tfp's clip-quantile estimator, which our adaptive factories run,
converges over many rounds (this tests tfp, not tff-dp code).

`AdaptiveClipGaussianFactory` and `PerLayerAdaptiveClipFactory` run tfp's
QuantileAdaptiveClipSumQuery, whose clip is its QuantileEstimatorQuery's estimate; running that
query for thousands of rounds inside one tf.function keeps this fast. The factory itself is
checked for convergence in test_aggregators.py.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_privacy as tfp

_CLIENTS = 100
_SIGMA = 0.5  # Client norms ~ LogNormal(0, 0.5).


def _true_quantile(gamma):
  from scipy import stats  # pylint: disable=g-import-not-at-top
  return float(np.exp(_SIGMA * stats.norm.ppf(gamma)))


def _run(gamma, initial, geometric, rounds, learning_rate, seed=0):
  """Final clip and mean clip of the last 200 rounds of the DP quantile estimator."""
  tf.random.set_seed(seed)
  query = tfp.QuantileAdaptiveClipSumQuery(
      initial_l2_norm_clip=initial, noise_multiplier=0.0, target_unclipped_quantile=gamma,
      learning_rate=learning_rate, clipped_count_stddev=_CLIENTS / 20.0,
      expected_num_records=float(_CLIENTS), geometric_update=geometric)

  spec = tf.TensorSpec([2], tf.float32)

  def below_sum(params, norms):
    # The sum of tfp's preprocessed quantile records, cast(norm <= clip) - 0.5 (sensitivity 0.5,
    # checked against query.preprocess_record below); vectorised so 1e4 rounds take seconds.
    return tf.reduce_sum(
        tf.cast(norms <= params.quantile_estimator_params.current_estimate, tf.float32) - 0.5)

  params0 = query.derive_sample_params(query.initial_global_state())
  for norm in (0.5 * initial, 2.0 * initial):
    record = tf.constant([norm, 0.0])
    assert float(query.preprocess_record(params0, record).quantile_estimator_state) == float(
        below_sum(params0, tf.constant([norm])))

  @tf.function
  def run():
    def body(t, state, tail):
      params = query.derive_sample_params(state)
      norms = tf.exp(_SIGMA * tf.random.normal([_CLIENTS]))
      sample = query.initial_sample_state(spec)
      sample = sample._replace(quantile_estimator_state=below_sum(params, norms))
      _, state, _ = query.get_noised_result(sample, state)
      clip = state.sum_state.l2_norm_clip
      tail = tail + tf.where(t >= rounds - 200, clip, 0.0)
      return t + 1, state, tail
    _, state, tail = tf.while_loop(lambda t, s, a: t < rounds, body,
                                   (0, query.initial_global_state(), 0.0))
    return state.sum_state.l2_norm_clip, tail / 200.0

  final, tail_mean = run()
  return float(final), float(tail_mean)


@pytest.mark.parametrize('geometric', [True, False], ids=['geometric', 'linear'])
@pytest.mark.parametrize('gamma', [0.1, 0.5, 0.9])
@pytest.mark.parametrize('factor', [0.01, 100.0], ids=['100x_small', '100x_large'])
def test_tfp_quantile_estimator_clip_converges_to_quantile(geometric, gamma, factor):
  target = _true_quantile(gamma)
  # Linear steps are in norm units: eta * |b - gamma| per round; 0.2 (paper/TFF default) is
  # fine for geometric; linear uses 0.05 near the optimum, so it needs more rounds from 100x.
  lr = 0.2 if geometric else 0.05
  # Enough rounds to walk from the initial clip at the slowest speed (less the bias of the
  # noised fraction clamped to [0, 1]), plus settling.
  slowest = lr * min(gamma, 1 - gamma)
  distance = abs(np.log(factor)) if geometric else abs(factor - 1) * target
  rounds = int(1.6 * distance / slowest) + 2000
  final, tail = _run(gamma, factor * target, geometric, rounds, lr)
  assert tail == pytest.approx(target, rel=0.1), (final, tail, target)
  assert final == pytest.approx(target, rel=0.1), (final, tail, target)
