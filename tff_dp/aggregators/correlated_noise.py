"""Correlated-noise DP-FTRL (`dp=blt|bandmf`): a `tff.aggregators` factory that clips each client
update to `clip`, sums, and adds the round's correlated noise stddev x (C^-1 z)_t, z_t fresh
standard Gaussian draws, then divides by `clients_per_round`.

The strategy C is a lower-triangular Toeplitz matrix (`tff_dp.matrix_factorization`), given as
a BLT (`buf_decay`, `output_scale`) or by banded coefficients. Solving C w = z one round at a
time needs, for a BLT, one model-sized buffer per pair (w_t = z_t - sum_i omega_i s_i, then
s_i <- theta_i s_i + w_t: the forward parameters, all real) and, for `bands` coefficients, the
last bands - 1 outputs (w_t = (z_t - sum_j c_j w_{t-j}) / c_0). Summed over rounds the model
receives the prefix sums plus A C^-1 z: the matrix mechanism.

The noise state (buffers, seed and step) is in the aggregator's state, hence in checkpoints:
a secret of the run (`RunFacts.noise_state_in_checkpoints`). Noise seeds come from OS randomness
as the tree factories' do. Each round reports (Contract 1) `privacy_queries` {update: (clip,
stddev)}, stddev the std of the fresh draws; the strategy the ledger replays is the factory's
`strategy` (fixed when it is built).
"""

import collections
from typing import Optional, Sequence

import dp_accounting
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp import ledger
from tff_dp.accounting import correlated
from tff_dp.aggregators import fixed
from tff_dp.aggregators import groups as groups_lib
from tff_dp.aggregators import privacy_queries
from tff_dp.aggregators import tree_aggregation
from tff_dp.aggregators import reporting
from tff_dp.aggregators.reporting import ReportingDPFactory


class CorrelatedSumQuery(tfp.SumAggregationDPQuery):
  """Sum of records clipped to `l2_norm_clip`, plus `stddev` x (C^-1 z)_t (module docstring).

  Exactly one of (`buf_decay`, `output_scale`) for a BLT or `coefs` for a banded strategy.
  """

  _GlobalState = collections.namedtuple(
      '_GlobalState', ['l2_norm_clip', 'stddev', 'seed', 'step', 'buffers'])

  def __init__(self, l2_norm_clip: float, stddev: float, record_specs, *, seed: int,
               buf_decay: Sequence[float] = (), output_scale: Sequence[float] = (),
               coefs: Sequence[float] = ()):
    if bool(buf_decay) == bool(coefs):
      raise ValueError('give a BLT (buf_decay, output_scale) or banded coefs, not both')
    self._clip, self._stddev, self._specs, self._seed = l2_norm_clip, stddev, record_specs, seed
    self._theta, self._omega = [float(v) for v in buf_decay], [float(v) for v in output_scale]
    self._coefs = [float(c) for c in coefs]
    self._num_buffers = len(self._theta) if self._theta else len(self._coefs) - 1

  def initial_global_state(self):
    zeros = tuple(tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), self._specs)
                  for _ in range(self._num_buffers))
    return self._GlobalState(tf.constant(self._clip, tf.float32),
                             tf.constant(self._stddev, tf.float32),
                             tf.constant([self._seed >> 32, self._seed & 0xFFFFFFFF], tf.int64),
                             tf.constant(0, tf.int64), zeros)

  def derive_sample_params(self, global_state):
    return global_state.l2_norm_clip

  def preprocess_record(self, params, record):
    flat, _ = tf.clip_by_global_norm(tf.nest.flatten(record), params)
    return tf.nest.pack_sequence_as(record, flat)

  def _fresh_draws(self, global_state, template):
    seed = tf.random.experimental.stateless_fold_in(global_state.seed, global_state.step)
    flat = tf.nest.flatten(template)
    draws = [tf.random.stateless_normal(
        tf.shape(v), tf.random.experimental.stateless_fold_in(seed, i), dtype=v.dtype)
             for i, v in enumerate(flat)]
    return tf.nest.pack_sequence_as(template, draws)

  def _next_noise(self, z, buffers):
    """(w_t, the next buffers) for the fresh draws z."""
    if self._theta:
      w = tf.nest.map_structure(
          lambda zz, *bs: zz - tf.add_n([o * b for o, b in zip(self._omega, bs)]), z, *buffers)
      new = tuple(tf.nest.map_structure(lambda b, ww, th=th: th * b + ww, buf, w)
                  for th, buf in zip(self._theta, buffers))
      return w, new
    c0, rest = self._coefs[0], self._coefs[1:]
    if not rest:
      return tf.nest.map_structure(lambda zz: zz / c0, z), buffers
    w = tf.nest.map_structure(
        lambda zz, *hs: (zz - tf.add_n([c * h for c, h in zip(rest, hs)])) / c0, z, *buffers)
    return w, (w,) + tuple(buffers[:-1])

  def get_noised_result(self, sample_state, global_state):
    z = self._fresh_draws(global_state, sample_state)
    w, buffers = self._next_noise(z, global_state.buffers)
    result = tf.nest.map_structure(lambda s, ww: s + global_state.stddev * ww, sample_state, w)
    new_state = global_state._replace(step=global_state.step + 1, buffers=buffers)
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
    tree_aggregation.noise_seed(noise_seed)   # Checked now, drawn per `create`.

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
  def num_buffers(self) -> int:
    """Model-sized tensors the noise state holds (its memory: that many model copies)."""
    if self.strategy.buf_decay:   # A BLT: its buffers.
      return len(self.strategy.buf_decay)
    return len(self.coefs) - 1

  def measurements(self) -> tuple[reporting.Measurement, ...]:
    return reporting.declare()

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, _ = groups_lib.value_specs_and_shapes(value_type)
    seed = tree_aggregation.noise_seed(self.noise_seed)
    if self.strategy.buf_decay:   # A BLT: streamed with its buffers.
      shape = dict(buf_decay=self.strategy.buf_decay, output_scale=self.strategy.output_scale)
    else:
      shape = dict(coefs=self.coefs)
    query = tfp.NormalizedQuery(
        CorrelatedSumQuery(self.clip, self.stddev, specs, seed=seed, **shape),
        denominator=self.clients_per_round)

    def tuples(query_state):
      state = query_state.numerator_state
      return collections.OrderedDict(
          update=privacy_queries.query_tuple(state.l2_norm_clip, state.stddev))

    return ReportingDPFactory(query, tuples).create(value_type)
