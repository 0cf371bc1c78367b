"""Joint clipping with per-vector scales alpha_j (McMahan et al. 2018, "joint clipping").

Per group g of vectors (tensors) v_1..v_k: scale v_j / alpha_j, clip the concatenation jointly
to S_g, sum, add N(0, sigma_g^2), and multiply part j back by alpha_j (post-processing). The
privacy tuple is (S_g, sigma_g). alpha_j is fixed or follows a DP estimate of the
`target_unclipped_quantile` of ||v_j|| (one tfp `QuantileEstimatorQuery` per vector, each a
`clipped_count/<group>/<j>` query), kept >= estimate_floor.MIN_ESTIMATE (a scale divides
each record: alpha_j = 0 would make the aggregate NaN). tfp has no scaled joint-clip query,
hence `JointClipSumQuery`; it reuses tfp's GaussianSumQuery (clip + noise) and
QuantileEstimatorQuery.
"""

import collections
import math
from typing import Optional, Sequence, Union

import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp
from tensorflow_privacy.privacy.dp_query import nested_query
import dp_accounting

from tff_dp import noise_budget
from tff_dp.aggregators import estimate_floor
from tff_dp.aggregators import groups as groups_lib
from tff_dp.aggregators import privacy_queries
from tff_dp import adaptive_clipping
from tff_dp.aggregators import quantile_clipping
from tff_dp.aggregators import reporting
from tff_dp.aggregators.reporting import ReportingDPFactory
from tff_dp.errors import UserInputError

JointState = collections.namedtuple('JointState', ['sum_state', 'scales', 'estimator_state'])
JointParams = collections.namedtuple('JointParams', ['sum_params', 'scales', 'estimator_params'])
JointSample = collections.namedtuple('JointSample', ['sum_state', 'estimator_state'])


class JointClipSumQuery(tfp.SumAggregationDPQuery):
  """Sum of records (lists of k tensors) scaled by 1/alpha_j, jointly clipped to `l2_norm_clip`,
  noised with `stddev`, unscaled by alpha_j. Adaptive alphas if `estimator` is given."""

  def __init__(self, l2_norm_clip: float, stddev: float, initial_scales: Sequence[float],
               estimator: Optional[nested_query.NestedSumQuery] = None):
    self._sum_query = tfp.GaussianSumQuery(l2_norm_clip, stddev)
    self._initial_scales = [float(a) for a in initial_scales]
    self._estimator = estimator

  def _scales(self, state):
    if self._estimator is None:
      return state.scales
    return tf.stack([s.current_estimate for s in state.estimator_state])

  def initial_global_state(self):
    est = self._estimator.initial_global_state() if self._estimator else ()
    return JointState(self._sum_query.initial_global_state(),
                      tf.constant(self._initial_scales, tf.float32), est)

  def derive_sample_params(self, global_state):
    est = (self._estimator.derive_sample_params(global_state.estimator_state)
           if self._estimator else ())
    return JointParams(self._sum_query.derive_sample_params(global_state.sum_state),
                       self._scales(global_state), est)

  def initial_sample_state(self, template=None):
    est = self._estimator.initial_sample_state() if self._estimator else ()
    return JointSample(self._sum_query.initial_sample_state(template), est)

  def preprocess_record(self, params, record):
    scaled = [v / tf.cast(params.scales[j], v.dtype) for j, v in enumerate(record)]
    clipped, _ = self._sum_query.preprocess_record_impl(params.sum_params, scaled)
    est = ()
    if self._estimator is not None:
      norms = [tf.norm(tf.cast(v, tf.float32)) for v in record]
      est = self._estimator.preprocess_record(params.estimator_params, norms)
    return JointSample(clipped, est)

  def get_noised_result(self, sample_state, global_state):
    scales = self._scales(global_state)
    noised, new_sum_state, event = self._sum_query.get_noised_result(
        sample_state.sum_state, global_state.sum_state)
    result = [v * tf.cast(scales[j], v.dtype) for j, v in enumerate(noised)]
    new_est = global_state.estimator_state
    if self._estimator is not None:
      _, new_est, est_event = self._estimator.get_noised_result(
          sample_state.estimator_state, global_state.estimator_state)
      new_est = type(new_est)(estimate_floor.floored(s) for s in new_est)
      event = dp_accounting.ComposedDpEvent([event, est_event])
    new_state = JointState(new_sum_state, global_state.scales, new_est)
    return result, new_state, event

  def derive_metrics(self, global_state):
    return collections.OrderedDict(scales=self._scales(global_state))


_DEFAULT = adaptive_clipping.AdaptiveClipping()
_SCALES = (
    reporting.Measurement('scale', 'each tensor\'s scale alpha the round used', covered=True),
    reporting.Measurement('next_scale', 'each tensor\'s scale alpha for the next round',
                          covered=True))


class JointClipFactory(tff.aggregators.UnweightedAggregationFactory):
  """Joint clipping per group (default: one group of all tensors) with per-vector scales.

  `initial_scale`: alpha_j (one float for all, or one per tensor); adapted towards the
  `target_unclipped_quantile` of ||v_j|| when `adaptive_scales`. `joint_clip`: S_g (default
  sqrt(k_g), the paper's conservative choice: no joint clipping when every ||v_j|| <= alpha_j).
  Noise: z_v from the budget split over the k count queries, then proportional/dimensionality
  allocation over groups; sigma_g = z_g S_g.
  Measurements: privacy_queries {update/group_g, clipped_count/group_g/tensor_j}, scale
  {tensor_j} (pre-round alpha), next_scale {tensor_j}, unclipped_fraction_estimate {tensor_j}
  (recovered from the step alpha -> next alpha: it understates b in a round where the
  MIN_ESTIMATE floor binds).
  """

  def __init__(self, *, noise_multiplier: float, clients_per_round: float,
               initial_scale: Union[float, Sequence[float]] = 1.0,
               joint_clip: Optional[float] = None, adaptive_scales: bool = True,
               adaptive: adaptive_clipping.AdaptiveClipping = _DEFAULT,
               noise_allocation: str = 'proportional', groups: groups_lib.Groups = 'all'):
    scales = ([float(a) for a in initial_scale] if isinstance(initial_scale, (list, tuple))
              else None)
    quantile_clipping.check_adaptive_args(
        noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
        initial_clip=min(scales) if scales else initial_scale)
    if joint_clip is not None and not joint_clip > 0:
      raise UserInputError(f'joint_clip must be positive, got {joint_clip}')
    noise_budget.check_noise_allocation(noise_allocation)
    self.noise_multiplier = float(noise_multiplier)
    self.clients_per_round = float(clients_per_round)
    self.initial_scale = scales if scales else float(initial_scale)
    self.joint_clip = None if joint_clip is None else float(joint_clip)
    self.adaptive_scales = bool(adaptive_scales)
    self.adaptive = adaptive
    self.clipped_count_stddev = (
        quantile_clipping.resolve_count_stddev(self.noise_multiplier,
                                               adaptive.clipped_count_stddev,
                                               clients_per_round)
        if self.adaptive_scales else 0.0)
    self.noise_allocation = noise_allocation
    self._groups = groups

  def groups_for(self, shapes) -> list[list[int]]:
    """The groups (flat tensor indices) jointly clipped for tensors of these shapes: a pure
    function of the factory's settings, the one `create` uses."""
    shapes = list(shapes)
    if self._groups == 'all':
      return [list(range(len(shapes)))]
    return groups_lib.resolve_groups(self._groups, shapes)

  def measurements(self) -> tuple[reporting.Measurement, ...]:
    return reporting.declare(self._extra_measurements())

  def _extra_measurements(self) -> tuple[reporting.Measurement, ...]:
    """Per tensor; the unclipped fractions only when the scales adapt."""
    return _SCALES + ((quantile_clipping.UNCLIPPED_FRACTION,) if self.adaptive_scales else ())

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, shapes = groups_lib.value_specs_and_shapes(value_type)
    n = len(shapes)
    groups = self.groups_for(shapes)
    names = groups_lib.group_names(len(groups))
    scales = self.initial_scale if isinstance(self.initial_scale, list) else [
        self.initial_scale] * n
    if len(scales) != n:
      raise UserInputError(f'{len(scales)} initial scales given for {n} tensors')
    num_counts = n if self.adaptive_scales else 0
    z_v = (noise_budget.update_noise_multiplier(self.noise_multiplier, self.clipped_count_stddev,
                                          num_counts) if num_counts else self.noise_multiplier)
    multipliers = noise_budget.group_noise_multipliers(
        z_v, groups_lib.group_sizes(groups, shapes), self.noise_allocation)
    clips = [self.joint_clip or math.sqrt(len(g)) for g in groups]
    geometric = self.adaptive.geometric
    sub_queries = []
    for g, z, s in zip(groups, multipliers, clips):
      estimator = None
      if self.adaptive_scales:
        estimator = nested_query.NestedSumQuery([
            tfp.QuantileEstimatorQuery(
                initial_estimate=scales[i], target_quantile=self.adaptive.target_unclipped_quantile,
                learning_rate=self.adaptive.clip_learning_rate,
                below_estimate_stddev=self.clipped_count_stddev,
                expected_num_records=self.clients_per_round, geometric_update=geometric)
            for i in g])
      sub_queries.append(JointClipSumQuery(s, z * s, [scales[i] for i in g], estimator))
    query = tfp.NormalizedQuery(
        groups_lib.RegroupedSumQuery(nested_query.NestedSumQuery(sub_queries), groups, specs),
        denominator=self.clients_per_round)
    adaptive = self.adaptive_scales
    gamma, eta = self.adaptive.target_unclipped_quantile, self.adaptive.clip_learning_rate

    def tuples(query_state):
      out = collections.OrderedDict()
      for gi, name in enumerate(names):
        s = query_state.numerator_state[gi].sum_state
        out[f'update/{name}'] = privacy_queries.query_tuple(s.l2_norm_clip, s.stddev)
      if adaptive:
        for gi, (name, g) in enumerate(zip(names, groups)):
          est = query_state.numerator_state[gi].estimator_state
          for j, i in enumerate(g):
            count = est[j].below_estimate_state.numerator_state
            out[f'clipped_count/{name}/tensor_{i}'] = privacy_queries.query_tuple(
                count.l2_norm_clip, count.stddev)
      return out

    def metrics(query_state, inner_measurements):
      dp_metrics = inner_measurements['dp_query_metrics']
      scale, next_scale, fraction = (collections.OrderedDict() for _ in range(3))
      for gi, g in enumerate(groups):
        st = query_state.numerator_state[gi]
        new = dp_metrics[f'{gi}/scales']
        for j, i in enumerate(g):
          used = st.estimator_state[j].current_estimate if adaptive else st.scales[j]
          scale[f'tensor_{i}'], next_scale[f'tensor_{i}'] = used, new[j]
          if adaptive:
            fraction[f'tensor_{i}'] = quantile_clipping.unclipped_fraction(used, new[j], gamma, eta,
                                                                   geometric)
      out = collections.OrderedDict(scale=scale, next_scale=next_scale)
      if adaptive:
        out['unclipped_fraction_estimate'] = fraction
      return out

    return ReportingDPFactory(query, tuples, metrics,
                              extra_measurements=self._extra_measurements()).create(value_type)
