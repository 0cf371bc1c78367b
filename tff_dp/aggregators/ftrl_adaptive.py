"""DP-FTRL with quantile-based adaptive clipping (TFF's `tree_adaptive`; Xu et al. 2023).

The construction of `tff.aggregators.DifferentiallyPrivateFactory.tree_adaptive`:
`NormalizedQuery(RestartQuery(QAdaClipTreeResSumQuery(...), restarts), clients_per_round)`,
with the effective `noise_multiplier` z split as TFF does (update tree z_v = (z^-2 -
(2 sigma_b)^-2)^-1/2, clipped-count tree sigma_b; `noise_budget.update_noise_multiplier`).
As TFF documents, the clip *estimate* follows the target quantile every round (a tree-noised
count), but the clip *used* (and the update tree's per-node stddev z_v * clip) changes only
at a restart, where the estimate is adopted and both trees start afresh: first after
`restart_warmup` rounds, then every `restart_frequency` rounds, and with `rounds_per_epoch`
also after every epoch (tree_aggregation.py says why).

Ours rather than the classmethod: the count tree's noise seed, and where the update tree
lives. tfp builds the count tree without a seed, i.e. seeded from the clock
(tree_aggregation.py); `_SeededTreeQuantileEstimatorQuery` gives it one from the OS CSPRNG like
the update tree's. With `feed_noise` (the default) the update tree's nodes, a model copy per
level, stay beside the process and its noise is fed each round (`noise_feed()`, as `ftrl`'s:
ftrl.py), restarted on the query's schedule (`stream`), scaled by the stddev of the clip in
use; the scalar count tree stays in the query. `feed_noise=False` keeps tfp's update tree in
the state. The tests check both against TFF's classmethod bit for bit with noise off, and the
fed noise against draws computed in the test (its law: tests/test_tree_noise.py).
"""

import collections

import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp
from tensorflow_privacy.privacy.dp_query import quantile_estimator_query

from tff_dp import adaptive_clipping
from tff_dp import noise_budget
from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import groups as groups_lib
from tff_dp.aggregators import noise_feed
from tff_dp.aggregators import quantile_clipping
from tff_dp.aggregators import tree_aggregation
from tff_dp.aggregators import reporting
from tff_dp.aggregators.reporting import ReportingDPFactory
from tff_dp.errors import UserInputError
from tff_dp.matrix_factorization import tree


class _SeededTreeQuantileEstimatorQuery(quantile_estimator_query.TreeQuantileEstimatorQuery):
  """tfp's tree quantile estimator whose count tree gets `noise_seed` (tfp passes none)."""

  def __init__(self, *args, noise_seed: int, **kwargs):
    self._count_noise_seed = noise_seed
    super().__init__(*args, **kwargs)

  def _construct_below_estimate_query(self, below_estimate_stddev, expected_num_records):
    # tfp's construction (clip 0.5: records are +-0.5), plus the seed.
    sum_query = tfp.TreeResidualSumQuery.build_l2_gaussian_query(
        clip_norm=0.5, noise_multiplier=2 * below_estimate_stddev,
        record_specs=tf.TensorSpec([]), noise_seed=self._count_noise_seed)
    return tfp.NormalizedQuery(sum_query, denominator=expected_num_records)


class _FedTreeSumQuery(correlated_noise.CorrelatedSumQuery):
  """The update tree's sum with its noise fed from beside the process, with the methods
  `tfp.QAdaClipTreeResSumQuery` calls on its tree sum: the new clip and stddev at a restart
  (the feed restarts its tree on the same schedule, `FtrlAdaptiveFactory.stream`)."""

  def preprocess_record_l2_impl(self, params, record):
    flat, norm = tf.clip_by_global_norm(tf.nest.flatten(record), params)
    return tf.nest.pack_sequence_as(record, flat), norm

  def reset_l2_clip_gaussian_noise(self, global_state, clip_norm, stddev):
    return global_state._replace(l2_norm_clip=clip_norm, stddev=stddev)

  def reset_state(self, noised_results, global_state):
    del noised_results
    return global_state


class _SeededQAdaClipTreeResSumQuery(tfp.QAdaClipTreeResSumQuery):
  """tfp's `QAdaClipTreeResSumQuery` with the seeded count tree (same arguments otherwise)."""

  def __init__(self, initial_l2_norm_clip, noise_multiplier, record_specs,
               target_unclipped_quantile, learning_rate, clipped_count_stddev,
               expected_num_records, geometric_update, noise_seed, count_noise_seed):
    super().__init__(initial_l2_norm_clip, noise_multiplier, record_specs,
                     target_unclipped_quantile, learning_rate, clipped_count_stddev,
                     expected_num_records, geometric_update=geometric_update,
                     noise_seed=noise_seed)
    self._quantile_estimator_query = _SeededTreeQuantileEstimatorQuery(
        initial_l2_norm_clip, target_unclipped_quantile, learning_rate, clipped_count_stddev,
        expected_num_records, geometric_update, noise_seed=count_noise_seed)


class _FedQAdaClipTreeResSumQuery(_SeededQAdaClipTreeResSumQuery):
  """The same query with its update tree's noise fed from beside the process."""

  def __init__(self, initial_l2_norm_clip, noise_multiplier, record_specs, *args, **kwargs):
    super().__init__(initial_l2_norm_clip, noise_multiplier, record_specs, *args, **kwargs)
    self._sum_query = _FedTreeSumQuery(
        initial_l2_norm_clip, initial_l2_norm_clip * noise_multiplier, record_specs)

  def derive_metrics(self, global_state):
    return collections.OrderedDict(
        current_clip=global_state.sum_state.l2_norm_clip,
        estimate_clip=global_state.quantile_estimator_state.current_estimate)


_DEFAULT = adaptive_clipping.AdaptiveClipping()
_MEASUREMENTS = (tree_aggregation.LEAF_MEASUREMENT, quantile_clipping.CLIP)


class FtrlAdaptiveFactory(tff.aggregators.UnweightedAggregationFactory):
  """DP-FTRL with adaptive clipping. Measurements: privacy_queries {update, clipped_count}
  (clip and per-node stddev of each tree), tree_aggregation {leaf}, clip (used this round),
  plus TFF's dp_query_metrics {current_clip, estimate_clip} (after the round) / dp."""

  def __init__(self, *, noise_multiplier: float, clients_per_round: float,
               initial_clip: float, restart_warmup: int = 128, restart_frequency: int = 1024,
               adaptive: adaptive_clipping.AdaptiveClipping = _DEFAULT,
               rounds_per_epoch: int | None = None, noise_seed: int | None = None,
               feed_noise: bool = True):
    quantile_clipping.check_adaptive_args(
        noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
        initial_clip=initial_clip)
    if not adaptive.geometric:
      raise UserInputError("DP-FTRL's adaptive clip is updated geometrically (as TFF's "
                           f'tree_adaptive), got `update_rule` {adaptive.update_rule!r}')
    tree_aggregation.check_restarts(restart_warmup, restart_frequency)
    self.noise_multiplier = float(noise_multiplier)
    self.clients_per_round = float(clients_per_round)
    self.initial_clip = float(initial_clip)
    self.restart_warmup, self.restart_frequency = restart_warmup, restart_frequency
    self.adaptive = adaptive
    self.clipped_count_stddev = quantile_clipping.resolve_count_stddev(
        self.noise_multiplier, adaptive.clipped_count_stddev, clients_per_round)
    self.update_noise_multiplier = noise_budget.update_noise_multiplier(
        self.noise_multiplier, self.clipped_count_stddev)
    self.rounds_per_epoch = tree_aggregation.check_rounds_per_epoch(rounds_per_epoch)
    self.noise_seed = noise_seed
    tree_aggregation.noise_seed(noise_seed)   # Checked now; drawn per `create`, `noise_feed`.
    self.feed_noise = bool(feed_noise)

  @property
  def stream(self) -> tree.TreeStream:
    """The update tree's noise, one residual a round (unit per-node stddev), restarted when
    the query restarts: after `restart_warmup` rounds, every `restart_frequency`, every epoch."""
    return tree.TreeStream(efficient=True, rounds_per_tree=self.rounds_per_epoch,
                           restart_period=self.restart_frequency,
                           restart_warmup=self.restart_warmup)

  def noise_feed(self) -> noise_feed.NoiseFeed | None:
    """What feeds this factory's processes their update tree's noise, seeded with `noise_seed`
    or, if None, from the OS CSPRNG (None without `feed_noise`: the tree is in the process)."""
    if not self.feed_noise:
      return None
    return noise_feed.NoiseFeed(self.stream, tree_aggregation.noise_seed(self.noise_seed))

  def measurements(self) -> tuple[reporting.Measurement, ...]:
    return reporting.declare(_MEASUREMENTS)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, _ = groups_lib.value_specs_and_shapes(value_type)
    seed = tree_aggregation.noise_seed(self.noise_seed)
    # The count tree's seed: independent of the update tree's (a fixed offset of a given
    # seed keeps runs with `noise_seed` reproducible).
    count_seed = (tree_aggregation.noise_seed(None) if self.noise_seed is None
                  else (seed + 1) % 2**63)
    fed, stream = self.feed_noise, self.stream
    query_class = _FedQAdaClipTreeResSumQuery if fed else _SeededQAdaClipTreeResSumQuery
    sum_query = query_class(
        self.initial_clip, self.update_noise_multiplier, specs,
        float(self.adaptive.target_unclipped_quantile),
        float(self.adaptive.clip_learning_rate), self.clipped_count_stddev,
        self.clients_per_round, geometric_update=True, noise_seed=seed,
        count_noise_seed=count_seed)
    if self.rounds_per_epoch is None:
      restarts = tfp.restart_query.PeriodicRoundRestartIndicator(
          period=self.restart_frequency, warmup=self.restart_warmup)
    else:
      restarts = tree_aggregation.EpochRestartIndicator(self.stream)
    query = tfp.NormalizedQuery(tfp.RestartQuery(sum_query, restarts),
                                denominator=self.clients_per_round)

    def trees(query_state):
      state = tree_aggregation.without_restart(query_state.numerator_state)
      count = state.quantile_estimator_state.below_estimate_state.numerator_state
      return state.sum_state, count

    def tuples(query_state):
      update, count = trees(query_state)
      return collections.OrderedDict(
          update=(correlated_noise.fed_tuple(update) if fed
                  else tree_aggregation.tree_tuple(update)),
          clipped_count=tree_aggregation.tree_tuple(count))

    def metrics(query_state, inner_measurements):
      del inner_measurements
      update, _ = trees(query_state)
      if fed:
        out = tree_aggregation.fed_leaf_measurement(stream, update)
        out['clip'] = update.l2_norm_clip
      else:
        out = tree_aggregation.leaf_measurement(update)
        out['clip'] = update.clip_value
      return out

    process = ReportingDPFactory(query, tuples, metrics,
                                 extra_measurements=_MEASUREMENTS).create(value_type)
    if not fed:
      return process
    return correlated_noise.refusing_unfed_rounds(process, lambda state: trees(state)[0])
