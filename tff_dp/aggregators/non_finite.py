"""Zeroes client updates that hold NaN or Inf before any clipping, and counts them.

A diverged client (NaN/Inf loss, bad data) would otherwise reach the DP aggregator: the L2 norm
of a NaN update is NaN, `clip_by_global_norm` returns NaN, and one client turns the noised sum,
the model and (through the clipped-count query) the adaptive clip into NaN for good. TFF's
`zeroing_factory` does not catch it: it zeroes when `norm > threshold`, which is False for NaN.
Hence this wrapper, outermost in the aggregation stack: a non-finite update becomes all zeros
(norm 0, inside every clip, so the DP sensitivity and the ledger are unchanged) and the number of
zeroed clients is reported as the `non_finite_zeroed` measurement. A zeroed client still counts as
one participant and, in the clipped-count query, as "not clipped": a bias of 1/m in that round's
unclipped fraction, never a NaN.

Inside `tff.learning` FedAvg the client work already zeroes a non-finite model delta
(`model_delta_client_work`, `zero_all_if_any_non_finite`) but does not count it (TFF's TODO
b/327051011); such clients arrive here as all-zero updates and are counted in `zero_updates`
(a client with data and a positive learning rate practically never produces an exactly zero
update). Both counts are diagnostics released without noise, like TFF's training metrics.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import measurements as measurements_lib
from tff_dp.aggregators import wrapping

MEASUREMENT_KEY = 'non_finite_zeroed'
ZERO_KEY = 'zero_updates'
_MEASUREMENTS = (
    measurements_lib.Measurement(MEASUREMENT_KEY, 'clients whose update had a NaN or Inf entry '
                                 '(zeroed), without noise'),
    measurements_lib.Measurement(ZERO_KEY, 'clients whose update was all zeros after that, '
                                 'without noise'))


class NonFiniteZeroingFactory(tff.aggregators.UnweightedAggregationFactory):
  """Wraps `inner_factory`; client values with any NaN/Inf entry are replaced by zeros."""

  def __init__(self, inner_factory: tff.aggregators.UnweightedAggregationFactory):
    self._inner = wrapping.check_inner_factory(inner_factory)

  def measurements(self) -> tuple[measurements_lib.Measurement, ...]:
    return _MEASUREMENTS + measurements_lib.declared(self._inner)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    wrapping.float_leaf_types(value_type, 'NonFiniteZeroingFactory')
    inner_process = self._inner.create(value_type)

    @tff.tensorflow.computation(value_type)
    def zero_non_finite(value):
      flat = tf.nest.flatten(value)
      finite = tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in flat]))
      zeroed = [tf.where(finite, v, tf.zeros_like(v)) for v in flat]
      all_zero = tf.reduce_all(tf.stack([tf.reduce_all(tf.equal(v, 0)) for v in zeroed]))
      return (tf.nest.pack_sequence_as(value, zeroed), tf.cast(tf.logical_not(finite), tf.int32),
              tf.cast(all_zero, tf.int32))

    inner_measurements_type = inner_process.next.type_signature.result.measurements.member

    @tff.tensorflow.computation(np.int32, np.int32, inner_measurements_type)
    def merge_measurements(count, zeros, inner):
      merged = collections.OrderedDict([(MEASUREMENT_KEY, count), (ZERO_KEY, zeros)])
      merged.update(inner.items() if hasattr(inner, 'items') else inner._asdict().items())
      return merged

    @tff.federated_computation()
    def init_fn():
      return inner_process.initialize()

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      checked = tff.federated_map(zero_non_finite, value)
      inner_output = inner_process.next(state, checked[0])
      count = tff.federated_sum(checked[1])
      zeros = tff.federated_sum(checked[2])
      measurements = tff.federated_map(merge_measurements,
                                       (count, zeros, inner_output.measurements))
      return tff.templates.MeasuredProcessOutput(
          state=inner_output.state, result=inner_output.result, measurements=measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)
