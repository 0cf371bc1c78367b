"""AdaDPS server-side variant: scale each client update before the inner (DP) aggregator.

`PreconditionedFactory(scales, inner_factory, unscale=False)` multiplies every client's model
update by fixed, non-sensitive per-coordinate scales (at the clients, before clipping/noise), runs
the inner factory, and optionally divides the aggregate by the scales afterwards (post-processing,
privacy-free). The inner factory clips the *scaled* update, so its sensitivity and noise, hence
the privacy accounting, are exactly those it reports. The state is the inner state unchanged and
the inner measurements are passed through under the key `preconditioned`, so the
`privacy_queries` measurement (and `extract_dp_event_from_state`) still work. TFF has no
per-coordinate scaling aggregator, hence this wrapper.
"""

import collections
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import coordinate_scales
from tff_dp import measurements as measurements_lib
from tff_dp.aggregators import wrapping

MEASUREMENT_KEY = 'preconditioned'


class PreconditionedFactory(tff.aggregators.UnweightedAggregationFactory):
  """Scales client values by `scales` before `inner_factory` (and divides after if `unscale`)."""

  def __init__(self, scales: Sequence[np.ndarray],
               inner_factory: Optional[tff.aggregators.UnweightedAggregationFactory] = None,
               unscale: bool = False):
    if inner_factory is None:
      inner_factory = tff.aggregators.UnweightedMeanFactory()
    self._inner = wrapping.check_inner_factory(inner_factory)
    self._scales = [np.asarray(s, np.float32) for s in scales]
    self._unscale = bool(unscale)

  def measurements(self) -> tuple[measurements_lib.Measurement, ...]:
    return (measurements_lib.Measurement(
        MEASUREMENT_KEY, 'the inner aggregator\'s measurements',
        inner=measurements_lib.declared(self._inner)),)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    shapes = [tuple(t.shape) for t in
              wrapping.float_leaf_types(value_type, 'PreconditionedFactory')]
    scales = coordinate_scales.validate_scales(self._scales, shapes,
                                               require_positive=self._unscale)
    inner_process = self._inner.create(value_type)

    def _map(value, fn):
      flat = tf.nest.flatten(value)
      out = [v if coordinate_scales.is_identity(s) else fn(v, tf.constant(s, v.dtype))
             for v, s in zip(flat, scales)]
      return tf.nest.pack_sequence_as(value, out)

    @tff.tensorflow.computation(value_type)
    def scale_fn(value):
      return _map(value, lambda v, s: v * s)

    @tff.tensorflow.computation(inner_process.next.type_signature.result.result.member)
    def unscale_fn(value):
      return _map(value, lambda v, s: v / s)

    @tff.federated_computation()
    def init_fn():
      return inner_process.initialize()

    @tff.federated_computation(init_fn.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      scaled = tff.federated_map(scale_fn, value)
      inner_output = inner_process.next(state, scaled)
      result = inner_output.result
      if self._unscale:
        result = tff.federated_map(unscale_fn, result)
      measurements = tff.federated_zip(
          collections.OrderedDict([(MEASUREMENT_KEY, inner_output.measurements)]))
      return tff.templates.MeasuredProcessOutput(
          state=inner_output.state, result=result, measurements=measurements)

    return tff.templates.AggregationProcess(init_fn, next_fn)

