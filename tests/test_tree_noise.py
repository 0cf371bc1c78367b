"""The tree's noise beside the process (`matrix_factorization.tree`, issue 53) against tfp's tree.

Both compute each round's noise as a linear map of standard Gaussian draws. Given one-hot
vectors for draws, each computes its map exactly: tfp's `TreeResidualSumQuery` (with tfp's
`RestartQuery`, as `ftrl` restarts it) through a `ValueGenerator` that returns the next basis
vector, ours through `draw(k)`. Two linear maps L of i.i.d. standard Gaussians give the same
distribution iff L L^T agree (the covariance of the rounds' noise, coordinate by coordinate).
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_privacy as tfp
from tensorflow_privacy.privacy.dp_query import tree_aggregation as tfp_tree

from tff_dp.aggregators import tree_aggregation
from tff_dp.matrix_factorization import streaming
from tff_dp.matrix_factorization import tree

ROUNDS = 13


class _BasisVectors(tfp_tree.ValueGenerator):
  """tfp's node values: e_0, e_1, ... (of length `dim`), one per draw."""

  def __init__(self, dim: int):
    self.dim = dim

  def initialize(self):
    return tf.constant(0)

  def next(self, state):
    return tf.one_hot(state, self.dim, dtype=tf.float32), state + 1


# Restart schedules: ours, and the restart indicator tfp's query is restarted by (`ftrl` with
# and without epochs, `ftrl_adaptive`'s warm-up and period, with and without epochs).
SCHEDULES = {
    'never': ({}, None),
    'epochs of 3': ({'rounds_per_tree': 3},
                    lambda: tfp.restart_query.PeriodicRoundRestartIndicator(period=3)),
    'epochs of 5': ({'rounds_per_tree': 5},
                    lambda: tfp.restart_query.PeriodicRoundRestartIndicator(period=5)),
    'warm-up 2, period 5': ({'restart_period': 5, 'restart_warmup': 2},
                            lambda: tfp.restart_query.PeriodicRoundRestartIndicator(5, 2)),
    'epochs of 4, warm-up 3, period 5': (
        {'rounds_per_tree': 4, 'restart_period': 5, 'restart_warmup': 3},
        lambda: tree_aggregation.EpochRestartIndicator(
            tree.TreeStream(rounds_per_tree=4, restart_period=5, restart_warmup=3))),
}


def _tfp_map(efficient: bool, schedule: str, dim: int) -> np.ndarray:
  """Row t: round t's noise in tfp's tree, as coefficients of its draws."""
  query = tfp.TreeResidualSumQuery(
      record_specs=tf.TensorSpec([dim]), noise_generator=_BasisVectors(dim),
      clip_fn=lambda records, clip: records, clip_value=1.0, use_efficient=efficient)
  restarts = SCHEDULES[schedule][1]
  if restarts is not None:
    query = tfp.RestartQuery(query, restarts())
  state, rows = query.initial_global_state(), []
  for _ in range(ROUNDS):
    noise, state, _ = query.get_noised_result(tf.zeros([dim]), state)
    rows.append(noise.numpy())
  return np.array(rows, np.float64)


def _our_map(efficient: bool, schedule: str, dim: int) -> np.ndarray:
  stream = tree.TreeStream(efficient=efficient, **SCHEDULES[schedule][0])
  drawn = [0]

  def draw(k):
    del k
    drawn[0] += 1
    return np.eye(dim, dtype=np.float32)[drawn[0] - 1]

  state, rows = stream.start(dim), []
  for _ in range(ROUNDS):
    noise, state = stream.advance_round(state, draw)
    rows.append(noise)
  return np.array(rows, np.float64)


@pytest.mark.parametrize('schedule', list(SCHEDULES))
@pytest.mark.parametrize('efficient', [True, False])
def test_the_tree_beside_the_process_is_tfps_tree_in_law(efficient, schedule):
  dim = 4 * ROUNDS   # More than either draws.
  theirs = _tfp_map(efficient, schedule, dim)
  ours = _our_map(efficient, schedule, dim)
  np.testing.assert_allclose(ours @ ours.T, theirs @ theirs.T, rtol=1e-6, atol=1e-6)
  # Not vacuous: the rounds' noise is correlated, and restarts change it.
  assert np.abs(np.triu(theirs @ theirs.T, 1)).max() > 0.1
  if schedule != 'never':
    whole = _tfp_map(efficient, 'never', dim)
    assert not np.allclose(whole @ whole.T, theirs @ theirs.T, atol=1e-3)


@pytest.mark.parametrize('schedule', [s for s in SCHEDULES if s != 'never'])
def test_the_leaves_restart_where_tfps_indicator_restarts(schedule):
  """Round t is leaf 1 exactly after the rounds tfp's indicator flags (for the schedule tfp
  lacks, ours: checked against the schedule written out below); the leaf computed on a tensor
  (the measurement's) is the leaf computed in Python."""
  stream = tree.TreeStream(**SCHEDULES[schedule][0])
  indicator = SCHEDULES[schedule][1]()
  state, flagged = indicator.initialize(), []
  for _ in range(3 * ROUNDS):
    flag, state = indicator.next(state)
    flagged.append(bool(flag))
  assert [stream.restarts_after(t) for t in range(1, 3 * ROUNDS + 1)] == flagged
  rounds = tf.range(1, 3 * ROUNDS + 1, dtype=tf.int64)
  assert list(stream.leaf(rounds, maximum=tf.maximum).numpy()) == [
      stream.leaf(t) for t in range(1, 3 * ROUNDS + 1)]


def test_the_epoch_indicator_restarts_on_the_written_out_schedule():
  """`ftrl_adaptive`'s indicator with epochs of 4, warm-up 3 and period 5 (tfp has none to
  compare with): after every 4th round and after rounds 3, 8, 13, ..., in tensors."""
  indicator = tree_aggregation.EpochRestartIndicator(
      tree.TreeStream(rounds_per_tree=4, restart_period=5, restart_warmup=3))
  state, flagged = indicator.initialize(), []
  for t in range(1, 31):
    flag, state = indicator.next(state)
    if flag:
      flagged.append(t)
  assert int(state) == 30
  assert flagged == [3, 4, 8, 12, 13, 16, 18, 20, 23, 24, 28]


@pytest.mark.parametrize('rounds_per_tree', [None, 4])
def test_the_nodes_held_are_one_per_level_of_a_tree(rounds_per_tree):
  """The state after round t holds one node per 1-bit of t's leaf (none after a tree's last
  round), never more than `num_buffers`."""
  stream = tree.TreeStream(rounds_per_tree=rounds_per_tree)
  state = stream.start(3)
  for t in range(1, 20):
    _, state = stream.advance_round(state, streaming.round_draws(1, t, 3))
    leaf = stream.leaf(t)
    held = 0 if leaf == rounds_per_tree else bin(leaf).count('1')
    assert len(state.buffers) == held <= stream.num_buffers, t
