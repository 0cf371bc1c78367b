"""The base of every DP factory here: TFF's `DifferentiallyPrivateFactory` plus the
`privacy_queries` measurement (Contract 1, docs/ARCHITECTURE.md)."""

import collections

import tensorflow_federated as tff
import tensorflow_privacy as tfp

from tff_dp import measurements as measurements_lib
from tff_dp.aggregators import privacy_queries

Measurement = measurements_lib.Measurement

# What every factory here reports, beside its own `extra_measurements`.
QUERIES = Measurement(
    privacy_queries.MEASUREMENT_KEY, 'the (L2 clip, noise stddev) of each query of the round, '
    'read from the query state before the round', covered=True)
TFF_MEASUREMENTS = (
    Measurement('dp_query_metrics', 'tensorflow_privacy\'s metrics of the query state after '
                'the round (clips the mechanism released)', covered=True),
    Measurement('dp', 'the measurements of TFF\'s inner summation (none with its default sum)'),
)


class ReportingDPFactory(tff.aggregators.UnweightedAggregationFactory):
  """TFF's `DifferentiallyPrivateFactory(query)` plus the `privacy_queries` measurement.

  TFF's factory does the clipping, summing and noising (unchanged). Its measurements hold
  metrics of the *post*-round query state, and its DpEvent only carries noise multipliers, so
  we add the (clip, stddev) tuples the round actually used, read from the pre-round state by
  `tuples_fn(query_state) -> OrderedDict(name -> OrderedDict(l2_norm_clip, noise_stddev))`.
  `extra_metrics_fn(pre_round_query_state, inner_measurements)` may add state metrics, whose
  top-level keys `extra_measurements` declares (tff_dp.measurements).
  `dp_factory`: a `DifferentiallyPrivateFactory` to wrap instead of one built from `query`
  (e.g. one of TFF's own classmethod factories).
  """

  def __init__(self, query: tfp.DPQuery, tuples_fn, extra_metrics_fn=None, dp_factory=None,
               extra_measurements: tuple[Measurement, ...] = ()):
    self._query = query
    self._tuples_fn = tuples_fn
    self._extra_metrics_fn = extra_metrics_fn
    self._extra_measurements = tuple(extra_measurements)
    self._dp_factory = (dp_factory if dp_factory is not None
                        else tff.aggregators.DifferentiallyPrivateFactory(query))

  @property
  def query(self) -> tfp.DPQuery:
    return self._query

  def measurements(self) -> tuple[Measurement, ...]:
    return declare(self._extra_measurements)

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


def check_declared(factory, measurements_type) -> None:
  """Refuses (RunFailedError) a process built with `factory` whose measurements
  (`measurements_type`, the server's) hold a value no declaration of `factory` names."""
  measurements_lib.check(measurements_lib.declared(factory), _value_paths(measurements_type))


def _value_paths(type_spec, path: tuple[str, ...] = ()):
  """The key paths of `type_spec`'s values (unnamed elements by index, as metrics.csv)."""
  if isinstance(type_spec, tff.StructType):
    for index, (name, element) in enumerate(tff.structure.to_elements(type_spec)):
      yield from _value_paths(element, path + (str(index) if name is None else name,))
  else:
    yield path


def declare(extra_measurements: tuple[Measurement, ...] = ()) -> tuple[Measurement, ...]:
  """What a `ReportingDPFactory` with `extra_measurements` reports, in its order (for a factory
  that builds one in its `create`)."""
  return (QUERIES, *extra_measurements, *TFF_MEASUREMENTS)
