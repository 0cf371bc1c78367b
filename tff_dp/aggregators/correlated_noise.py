"""Correlated-noise DP-FTRL (`dp=blt|bandmf`): a `tff.aggregators` factory that clips each client
update to `clip`, sums, and adds the round's correlated noise stddev x (C^-1 z)_t, z_t fresh
standard Gaussian draws, then divides by `clients_per_round`.

The strategy C is a lower-triangular Toeplitz matrix (`tff_dp.matrix_factorization`), given as
a BLT (`buf_decay`, `output_scale`) or by banded coefficients. Summed over rounds the model
receives the prefix sums plus A C^-1 z: the matrix mechanism.

The noise state (a BLT's buffers, a banded strategy's last bands - 1 outputs: many model copies)
stays beside the process, in the coordinator: `noise_feed()` gives what writes each round's noise
into the process state before the round (`tff_dp.aggregators.noise_feed`), so that one noise
input, not the whole noise state, crosses to the worker each round. The feed's seed and buffers
are in checkpoints: a secret of the run (`RunFacts.noise_state_in_checkpoints`). Noise seeds
come from OS randomness as the tree factories' do. Each round reports (Contract 1)
`privacy_queries` {update: (clip, stddev)}, stddev the std of the fresh draws; the strategy the
ledger replays is the factory's `strategy` (fixed when it is built).
"""

import collections
from typing import Optional, Sequence

import dp_accounting
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp import ledger
from tff_dp.accounting import correlated
from tff_dp.matrix_factorization import streaming
from tff_dp.aggregators import fixed
from tff_dp.aggregators import groups as groups_lib
from tff_dp.aggregators import noise_feed
from tff_dp.aggregators import privacy_queries
from tff_dp.aggregators import tree_aggregation
from tff_dp.aggregators import reporting
from tff_dp.aggregators.reporting import ReportingDPFactory


class CorrelatedSumQuery(tfp.SumAggregationDPQuery):
  """Sum of records clipped to `l2_norm_clip`, plus `stddev` x the round's noise w_t, which the
  coordinator writes into the state before the round (`noise_feed`); a round whose noise was
  not written for it fails."""

  def __init__(self, l2_norm_clip: float, stddev: float, record_specs):
    self._clip, self._stddev, self._specs = l2_norm_clip, stddev, record_specs

  def initial_global_state(self):
    zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), self._specs)
    return noise_feed.FedNoise(tf.constant(self._clip, tf.float32),
                               tf.constant(self._stddev, tf.float32),
                               tf.constant(0, tf.int64), tf.constant(0, tf.int64), zeros)

  def derive_sample_params(self, global_state):
    return global_state.l2_norm_clip

  def preprocess_record(self, params, record):
    flat, _ = tf.clip_by_global_norm(tf.nest.flatten(record), params)
    return tf.nest.pack_sequence_as(record, flat)

  def get_noised_result(self, sample_state, global_state):
    result = tf.nest.map_structure(lambda s, w: s + global_state.stddev * w, sample_state,
                                   global_state.noise)
    new_state = global_state._replace(
        step=global_state.step + 1, noise=tf.nest.map_structure(tf.zeros_like,
                                                                global_state.noise))
    return result, new_state, dp_accounting.UnsupportedDpEvent()


class CorrelatedNoiseFactory(tff.aggregators.UnweightedAggregationFactory):
  """Correlated-noise DP-FTRL aggregation (fixed clip) for the recorded `strategy`.

  `noise_multiplier` z: the run's (`tff_dp.accounting.correlated`); the fresh draws have
  stddev z x clip x sensitivity, sensitivity^2 the strategy's min-separation sensitivity over
  its rounds (amplified: its largest column norm). Measurements: privacy_queries
  {update: (clip, that stddev)}, plus TFF's dp_query_metrics / dp.
  """

  def __init__(self, *, strategy: ledger.CorrelatedNoise, coefs: Sequence[float],
               sensitivity: float, clip: float, noise_multiplier: float,
               clients_per_round: float, noise_seed: Optional[int] = None):
    fixed.check_fixed_args(clip, noise_multiplier, clients_per_round)
    self.strategy = strategy
    self.coefs = tuple(float(c) for c in coefs)
    self.clip, self.noise_multiplier = float(clip), float(noise_multiplier)
    self.clients_per_round = float(clients_per_round)
    self.stddev = self.noise_multiplier * self.clip * float(sensitivity)
    self.noise_seed = noise_seed
    tree_aggregation.noise_seed(noise_seed)   # Checked now; the feed draws its own if None.

  @classmethod
  def for_strategy(cls, found: correlated.Strategy, *, rounds: int, min_separation: int,
                   max_participations: int, clip: float, noise_multiplier: float,
                   clients_per_round: float,
                   noise_seed: Optional[int] = None) -> 'CorrelatedNoiseFactory':
    """The factory of strategy `found` (built by its mechanism, `tff_dp.mechanisms`, for
    `rounds` rounds of a schedule where each client participates at most
    `max_participations` times, at least `min_separation` apart): fresh draws scaled to its
    sensitivity (`tff_dp.accounting.correlated`)."""
    return cls(strategy=correlated.recorded(found, rounds, min_separation, max_participations),
               coefs=found.coefs,
               sensitivity=found.sensitivity_squared ** 0.5, clip=clip,
               noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
               noise_seed=noise_seed)

  @property
  def stream(self) -> streaming.Stream:
    """C^-1 applied forward: a BLT by its buffers, any other strategy by its coefficients."""
    if self.strategy.buf_decay:
      return streaming.Stream(buf_decay=tuple(self.strategy.buf_decay),
                              output_scale=tuple(self.strategy.output_scale))
    return streaming.Stream(coefs=self.coefs)

  @property
  def num_buffers(self) -> int:
    """Model-sized arrays the noise feed holds (its memory: that many model copies)."""
    return self.stream.num_buffers

  def noise_feed(self) -> noise_feed.NoiseFeed:
    """What feeds this factory's processes their noise (`noise_feed`), seeded with
    `noise_seed` or, if None, from OS randomness."""
    return noise_feed.NoiseFeed(self.stream, tree_aggregation.noise_seed(self.noise_seed))

  def measurements(self) -> tuple[reporting.Measurement, ...]:
    return reporting.declare()

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, _ = groups_lib.value_specs_and_shapes(value_type)
    query = tfp.NormalizedQuery(CorrelatedSumQuery(self.clip, self.stddev, specs),
                                denominator=self.clients_per_round)

    def tuples(query_state):
      return collections.OrderedDict(update=fed_tuple(query_state.numerator_state))

    return refusing_unfed_rounds(ReportingDPFactory(query, tuples).create(value_type))


def fed_tuple(slot: noise_feed.FedNoise) -> collections.OrderedDict:
  """(clip, stddev of the fed draws) of a fed sum's pre-round state (Contract 1 entry)."""
  return privacy_queries.query_tuple(slot.l2_norm_clip, slot.stddev)


def refusing_unfed_rounds(process: tff.templates.AggregationProcess,
                          slot_of=lambda query_state: query_state.numerator_state):
  """`process`, whose `next` fails on a state whose noise slot (`slot_of` its query state) was
  not filled for the round.

  Checked before the inner `next`, not in the query: TFF's DifferentiallyPrivateFactory runs
  the query's `get_noised_result` on the initial state once in `initialize` (for its DpEvent).
  """
  state_type = process.initialize.type_signature.result.member

  @tff.tensorflow.computation(state_type)
  def check_fed(state):
    slot = slot_of(state.query_state)
    fed = tf.debugging.assert_equal(
        slot.fed_round, slot.step + 1,
        message='the correlated noise of this round was not fed (tff_dp NoiseFeed.into)')
    with tf.control_dependencies([fed]):
      return tf.nest.map_structure(tf.identity, state)

  @tff.federated_computation(process.next.type_signature.parameter)
  def next_fn(state, value):
    return process.next(tff.federated_map(check_fed, state), value)

  return tff.templates.AggregationProcess(process.initialize, next_fn)
