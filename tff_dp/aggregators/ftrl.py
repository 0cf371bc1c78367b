"""DP-FTRL (Kairouz et al. 2021): fixed clip, tree-aggregation noise, no sampling needed.

The mechanism of TFF's `DifferentiallyPrivateFactory.tree_aggregation`: clip each client update
to `clip`, sum, add tree-aggregation noise of per-node stddev `noise_multiplier * clip`, divide
by `clients_per_round`. Its output each round is the residual noised(s_t) - noised(s_{t-1}) of
the noised prefix sums s_t of the clipped sums (`tfp.TreeResidualSumQuery.get_noised_result`),
so the server optimizer consumes it like any mean update (docs/ENGINEERING_NOTES.md: how that
is the FTRL update). With `rounds_per_epoch` the tree also restarts after every epoch
(tree_aggregation.py says why).

With `feed_noise` (the default) the tree's nodes (a model copy per level) stay beside the
process: its noise is fed to it like the other correlated noises (`noise_feed()`,
`tff_dp.aggregators.noise_feed`), computed by `matrix_factorization.tree` as tfp's tree computes
it (the same linear map from Gaussian draws, tested against tfp's queries), so one residual,
not the tree, crosses to the worker each round. The feed's seed and nodes are secrets of the
run, as TFF's tree state is. `feed_noise=False` keeps the tree in the process state (TFF's own
factory, restarted with `rounds_per_epoch`): a drop-in for a pipeline that cannot feed it.
"""

import collections

import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp.aggregators import correlated_noise
from tff_dp.aggregators import fixed
from tff_dp.aggregators import groups as groups_lib
from tff_dp.aggregators import noise_feed
from tff_dp.aggregators import reporting
from tff_dp.aggregators import tree_aggregation
from tff_dp.aggregators.reporting import ReportingDPFactory
from tff_dp.matrix_factorization import tree

_MEASUREMENTS = (tree_aggregation.LEAF_MEASUREMENT,)


class FtrlFactory(tff.aggregators.UnweightedAggregationFactory):
  """DP-FTRL aggregation (fixed clip). Measurements: privacy_queries {update: (clip, per-node
  stddev)}, tree_aggregation {leaf}, plus TFF's dp_query_metrics / dp. With `feed_noise` its
  processes take their noise from `noise_feed()` (module docstring)."""

  def __init__(self, *, clip: float, noise_multiplier: float, clients_per_round: float,
               rounds_per_epoch: int | None = None, noise_seed: int | None = None,
               use_efficient: bool = True, feed_noise: bool = True):
    fixed.check_fixed_args(clip, noise_multiplier, clients_per_round)
    self.clip = float(clip)
    self.noise_multiplier = float(noise_multiplier)
    self.clients_per_round = float(clients_per_round)
    self.rounds_per_epoch = tree_aggregation.check_rounds_per_epoch(rounds_per_epoch)
    self.noise_seed = noise_seed
    tree_aggregation.noise_seed(noise_seed)   # Checked now, drawn per `noise_feed`.
    self.use_efficient = bool(use_efficient)
    self.feed_noise = bool(feed_noise)

  @property
  def stream(self) -> tree.TreeStream:
    """The tree's noise, one residual a round (unit per-node stddev)."""
    return tree.TreeStream(efficient=self.use_efficient, rounds_per_tree=self.rounds_per_epoch)

  def noise_feed(self) -> noise_feed.NoiseFeed | None:
    """What feeds this factory's processes their noise, seeded with `noise_seed` or, if None,
    from the OS CSPRNG (None without `feed_noise`: the tree is in the process)."""
    if not self.feed_noise:
      return None
    return noise_feed.NoiseFeed(self.stream, tree_aggregation.noise_seed(self.noise_seed))

  def measurements(self) -> tuple[reporting.Measurement, ...]:
    return reporting.declare(_MEASUREMENTS)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, _ = groups_lib.value_specs_and_shapes(value_type)
    if not self.feed_noise:
      return self._create_with_tffs_tree(value_type, specs)
    query = tfp.NormalizedQuery(
        correlated_noise.CorrelatedSumQuery(self.clip, self.noise_multiplier * self.clip, specs),
        denominator=self.clients_per_round)
    stream = self.stream

    def tuples(query_state):
      return collections.OrderedDict(
          update=correlated_noise.fed_tuple(query_state.numerator_state))

    def metrics(query_state, inner_measurements):
      del inner_measurements
      return tree_aggregation.fed_leaf_measurement(stream, query_state.numerator_state)

    return correlated_noise.refusing_unfed_rounds(
        ReportingDPFactory(query, tuples, metrics,
                           extra_measurements=_MEASUREMENTS).create(value_type))

  def _create_with_tffs_tree(self, value_type, specs) -> tff.templates.AggregationProcess:
    seed = tree_aggregation.noise_seed(self.noise_seed)
    if self.rounds_per_epoch is None:
      dp_factory = tff.aggregators.DifferentiallyPrivateFactory.tree_aggregation(
          noise_multiplier=self.noise_multiplier, clients_per_round=self.clients_per_round,
          l2_norm_clip=self.clip, record_specs=specs, noise_seed=seed,
          use_efficient=self.use_efficient)
    else:   # TFF's query, restarted after every epoch.
      sum_query = tfp.TreeResidualSumQuery.build_l2_gaussian_query(
          self.clip, self.noise_multiplier, specs, noise_seed=seed,
          use_efficient=self.use_efficient)
      restarts = tfp.restart_query.PeriodicRoundRestartIndicator(period=self.rounds_per_epoch)
      dp_factory = tff.aggregators.DifferentiallyPrivateFactory(tfp.NormalizedQuery(
          tfp.RestartQuery(sum_query, restarts), denominator=self.clients_per_round))

    def tree_state(query_state):
      return tree_aggregation.without_restart(query_state.numerator_state)

    def tuples(query_state):
      return collections.OrderedDict(update=tree_aggregation.tree_tuple(tree_state(query_state)))

    def metrics(query_state, inner_measurements):
      del inner_measurements
      return tree_aggregation.leaf_measurement(tree_state(query_state))

    return ReportingDPFactory(None, tuples, metrics, dp_factory=dp_factory,
                              extra_measurements=_MEASUREMENTS).create(value_type)
