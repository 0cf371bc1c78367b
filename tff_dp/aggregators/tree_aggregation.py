"""What the two DP-FTRL factories (`ftrl`, `ftrl_adaptive`) share: restarts, seeds, the leaf.

Both run the mechanisms of TFF 0.87's `DifferentiallyPrivateFactory.tree_aggregation` /
`.tree_adaptive` (`tfp.TreeResidualSumQuery` / `tfp.QAdaClipTreeResSumQuery` inside
`tfp.NormalizedQuery`) with the (update) tree's nodes beside the process by default (ftrl.py;
the tests check its noise against tfp's tree exactly, as a linear map of the Gaussian draws),
or with `feed_noise=False` tfp's tree in the state (the tests check that against TFF's
classmethods bit for bit; `ftrl_adaptive`'s with noise off). Three things are ours:

  * Restarts at epoch boundaries. The accountant (`SingleEpochTreeAggregationDpEvent`) needs
    every tree to hold each client at most once, which shuffled participation guarantees only
    within an epoch; so with `rounds_per_epoch` set a tree also restarts after every epoch.
    TFF's restart schedule (`PeriodicRoundRestartIndicator(period, warmup)`, warmup >= 1)
    cannot express that, hence `EpochRestartIndicator` (tfp's `RestartIndicator` interface).
  * The noise seed. tfp seeds the tree's Gaussian generator from the clock when no seed is
    given (a microsecond timestamp: guessable, and with it all the noise); we draw it from the
    OS CSPRNG instead. The (update) tree's seed and nodes live in the noise feed, or with
    `feed_noise=False` in the aggregator state, as the clipped-count tree's do, so checkpoints
    of a DP-FTRL run hold secrets (see docs/ENGINEERING_NOTES.md, "DP-FTRL").
  * The measurement: `privacy_queries` (Contract 1) with the per-node noise stddev, and
    `tree_aggregation/leaf`, this round's 1-based position in its tree, read from the
    pre-round state (1: the round starts a new tree, i.e. a restart happened before it).
"""

import collections
import os
from typing import Optional

import tensorflow as tf
import tensorflow_privacy as tfp

from tff_dp import measurements
from tff_dp.aggregators import privacy_queries
from tff_dp.errors import UserInputError
from tff_dp.matrix_factorization import tree


class EpochRestartIndicator(tfp.restart_query.RestartIndicator):
  """Restart when `schedule` (a `tree.TreeStream`, the schedule's one home, which also
  restarts the tree fed from beside the process) restarts: after every `rounds_per_tree`-th
  call and, with `restart_period`, after the calls numbered `restart_warmup`,
  `restart_warmup + restart_period`, ... (TFF's tree_adaptive schedule). Same state as tfp's
  `PeriodicRoundRestartIndicator`: the int32 number of calls so far."""

  def __init__(self, schedule: tree.TreeStream):
    self.schedule = schedule

  def initialize(self):
    return tf.constant(0, tf.int32)

  def next(self, state):
    state = state + tf.constant(1, tf.int32)
    # `tf.equal`, not `==`: in TFF's graphs a tensor's `==` is identity, not elementwise.
    return tf.equal(self.schedule.leaf(state + 1, maximum=tf.maximum), 1), state


def check_rounds_per_epoch(rounds_per_epoch) -> Optional[int]:
  if rounds_per_epoch is None:
    return None
  if isinstance(rounds_per_epoch, bool) or not isinstance(rounds_per_epoch, int) or (
      rounds_per_epoch < 1):
    raise UserInputError(f'`rounds_per_epoch` must be a positive integer or None, got '
                         f'{rounds_per_epoch!r}')
  return rounds_per_epoch


def check_restarts(restart_warmup, restart_frequency) -> None:
  """TFF tree_adaptive's schedule: first restart after `restart_warmup` rounds, then every
  `restart_frequency` rounds (tfp requires 1 <= warmup < frequency)."""
  for name, value in (('restart_warmup', restart_warmup),
                      ('restart_frequency', restart_frequency)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise UserInputError(f'`{name}` must be a positive integer, got {value!r}')
  if restart_warmup >= restart_frequency:
    raise UserInputError(f'`restart_warmup` ({restart_warmup}) must be smaller than '
                         f'`restart_frequency` ({restart_frequency})')


def noise_seed(seed: Optional[int]) -> int:
  """The given seed, or 63 bits from the OS CSPRNG (tfp would seed from the clock)."""
  if seed is None:
    return int.from_bytes(os.urandom(8), 'big') >> 1
  if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
    raise UserInputError(f'`noise_seed` must be an integer in [0, 2^63) or None, got {seed!r}')
  return seed


def without_restart(query_state):
  """The inner query state of a `tfp.RestartQuery` state (the state itself otherwise)."""
  return getattr(query_state, 'inner_query_state', query_state)


def tree_tuple(tree_sum_state) -> collections.OrderedDict:
  """(clip, per-node noise stddev) of a `TreeResidualSumQuery` state (Contract 1 entry)."""
  return privacy_queries.query_tuple(
      tree_sum_state.clip_value, tree_sum_state.tree_state.value_generator_state.stddev)


LEAF_MEASUREMENT = measurements.Measurement(
    privacy_queries.TREE_KEY, 'the 1-based leaf the round fills in its tree (`leaf`), from '
    'the public schedule', covered=True)


def leaf_measurement(tree_sum_state) -> collections.OrderedDict:
  """{tree_aggregation: {leaf}}: the 1-based leaf this round fills in its tree.

  tfp's tree state lists the levels of the completed subtrees left of the next leaf
  (`level_buffer_idx`); the next leaf's 0-based index is sum(2^level) - 1
  (`tree_aggregation.get_step_idx`), so the 1-based leaf is sum(2^level).
  """
  levels = tree_sum_state.tree_state.level_buffer_idx
  return leaf_of(tf.reduce_sum(tf.bitwise.left_shift(tf.ones_like(levels), levels)))


def fed_leaf_measurement(stream, slot) -> collections.OrderedDict:
  """{tree_aggregation: {leaf}} of a tree fed from beside the process: the leaf after the
  `slot`'s completed rounds (a `noise_feed.FedNoise`) in `stream` (a `tree.TreeStream`)."""
  return leaf_of(tf.cast(stream.leaf(slot.step + 1, maximum=tf.maximum), tf.int32))


def leaf_of(leaf) -> collections.OrderedDict:
  """{tree_aggregation: {leaf}} for the 1-based `leaf` (int32)."""
  return collections.OrderedDict([(privacy_queries.TREE_KEY, collections.OrderedDict(
      leaf=leaf))])
