"""Fixed-clip Gaussian DP aggregation that reports its executed privacy tuple each round."""

import collections

import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp.aggregators import privacy_queries
from tff_dp.errors import UserInputError


class ReportingDPFactory(tff.aggregators.UnweightedAggregationFactory):
  """TFF's `DifferentiallyPrivateFactory(query)` plus the `privacy_queries` measurement.

  TFF's factory does the clipping, summing and noising (unchanged). Its measurements hold
  metrics of the *post*-round query state, and its DpEvent only carries noise multipliers, so
  we add the (clip, stddev) tuples the round actually used, read from the pre-round state by
  `tuples_fn(query_state) -> OrderedDict(name -> OrderedDict(l2_norm_clip, noise_stddev))`.
  `extra_metrics_fn(pre_round_query_state, inner_measurements)` may add state metrics.
  `dp_factory`: a `DifferentiallyPrivateFactory` to wrap instead of one built from `query`
  (e.g. one of TFF's own classmethod factories).
  """

  def __init__(self, query: tfp.DPQuery, tuples_fn, extra_metrics_fn=None, dp_factory=None):
    self._query = query
    self._tuples_fn = tuples_fn
    self._extra_metrics_fn = extra_metrics_fn
    self._dp_factory = (dp_factory if dp_factory is not None
                        else tff.aggregators.DifferentiallyPrivateFactory(query))

  @property
  def query(self) -> tfp.DPQuery:
    return self._query

  def create(self, value_type) -> tff.templates.AggregationProcess:
    inner = self._dp_factory.create(value_type)
    state_type = inner.initialize.type_signature.result.member
    inner_measurements_type = inner.next.type_signature.result.measurements.member

    @tff.tensorflow.computation(state_type, inner_measurements_type)
    def merge(pre_round_state, inner_measurements):
      merged = collections.OrderedDict()
      merged[privacy_queries.MEASUREMENT_KEY] = self._tuples_fn(pre_round_state.query_state)
      if self._extra_metrics_fn is not None:
        merged.update(self._extra_metrics_fn(pre_round_state.query_state, inner_measurements))
      merged.update(inner_measurements)
      return merged

    @tff.federated_computation(inner.next.type_signature.parameter)
    def next_fn(state, value):
      output = inner.next(state, value)
      measurements = tff.federated_map(merge, (state, output.measurements))
      return tff.templates.MeasuredProcessOutput(
          state=output.state, result=output.result, measurements=measurements)

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def check_fixed_args(clip, noise_multiplier, clients_per_round) -> None:
  """UserInputError for a fixed clip, noise multiplier or cohort size out of range."""
  if not clip > 0:
    raise UserInputError(f'`clip` must be positive, got {clip}')
  if not noise_multiplier >= 0:
    raise UserInputError(f'`noise_multiplier` must be >= 0, got {noise_multiplier}')
  if not clients_per_round > 0:
    raise UserInputError(f'`clients_per_round` must be positive, got {clients_per_round}')


class FixedClipGaussianFactory(ReportingDPFactory):
  """Flat fixed clipping: clip each client update to L2 norm `clip`, add N(0, (z*clip)^2).

  Equivalent to `tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed` (same tfp query:
  `NormalizedQuery(GaussianSumQuery(clip, z*clip), clients_per_round)`).
  """

  def __init__(self, clip: float, noise_multiplier: float, clients_per_round: float):
    check_fixed_args(clip, noise_multiplier, clients_per_round)
    self.clip = float(clip)
    self.noise_multiplier = float(noise_multiplier)
    query = tfp.NormalizedQuery(
        tfp.GaussianSumQuery(l2_norm_clip=self.clip, stddev=self.clip * self.noise_multiplier),
        denominator=float(clients_per_round))

    def tuples(query_state):
      sum_state = query_state.numerator_state
      return collections.OrderedDict(update=privacy_queries.query_tuple(
          sum_state.l2_norm_clip, sum_state.stddev))

    super().__init__(query, tuples)
