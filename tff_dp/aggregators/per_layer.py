"""Per-layer (per-group) adaptive clipping: one clip and one quantile estimate per group.

Each group of tensors gets its own tensorflow_privacy `QuantileAdaptiveClipSumQuery` (clip,
sum, noise, DP quantile update; its clip kept >= `estimate_floor.MIN_ESTIMATE`, see there),
combined with tfp's `NestedSumQuery` and run by TFF's `DifferentiallyPrivateFactory`. tfp's
nested queries need the record to have the structure of the query, so `RegroupedSumQuery`
(ours: neither tfp nor TFF regroups records) maps the flat model update into a list of groups
and the noised sum back into the model structure.

Noise allocation follows the ledger paper (McMahan et al. 2018): after the adaptive budget split
z_v = (z^-2 - G (2 sigma_b)^-2)^-1/2, group g gets multiplier z_g = z_v sqrt(G) (proportional)
or z_v sqrt(D / d_g) (dimensionality), so that by Eq. (1) the round's effective multiplier is z.
"""

import collections
from typing import Callable, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
import tensorflow_privacy as tfp
from tensorflow_privacy.privacy.dp_query import nested_query
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_dp.aggregators import budget
from tff_dp.aggregators import estimate_floor
from tff_dp.aggregators import privacy_queries
from tff_dp.aggregators.fixed import ReportingDPFactory
from tff_dp.errors import UserInputError

UPDATE_RULES = ('geometric', 'linear')
NOISE_ALLOCATIONS = ('proportional', 'dimensionality')

# None: one group per tensor; list of lists of flat tensor indices; or a function of the list of
# flat tensor shapes returning such a list.
Groups = Union[None, Sequence[Sequence[int]], Callable[[list], Sequence[Sequence[int]]]]


def value_specs_and_shapes(value_type):
  """(tf.TensorSpec structure, list of flat shapes) of a TFF value type of float tensors."""
  specs = type_conversions.type_to_tf_tensor_specs(value_type)
  flat = tf.nest.flatten(specs)
  for i, spec in enumerate(flat):
    if not spec.dtype.is_floating:
      raise TypeError(f'DP aggregation needs float tensors; leaf {i} is {spec}')
  return specs, [tuple(s.shape) for s in flat]


def resolve_groups(groups: Groups, shapes: Sequence[tuple]) -> list[list[int]]:
  """Validated partition of the flat tensor indices into groups."""
  n = len(shapes)
  if groups is None:
    resolved = [[i] for i in range(n)]
  elif callable(groups):
    resolved = groups(list(shapes))
  else:
    resolved = groups
  resolved = [[int(i) for i in g] for g in resolved]
  seen = sorted(i for g in resolved for i in g)
  if any(not g for g in resolved) or seen != list(range(n)):
    raise UserInputError(
        f'clip groups must partition the {n} tensor indices 0..{n - 1} into non-empty groups '
        f'(each index exactly once); got {resolved}')
  return resolved


def group_sizes(groups: Sequence[Sequence[int]], shapes: Sequence[tuple]) -> list[int]:
  return [int(sum(int(np.prod(shapes[i])) for i in g)) for g in groups]


def group_names(num_groups: int) -> list[str]:
  return [f'group_{g}' for g in range(num_groups)]


class RegroupedSumQuery(tfp.SumAggregationDPQuery):
  """Runs a `NestedSumQuery` over a list of groups on records with the model's structure.

  Written here because tfp's NestedQuery requires the record to already have the query's
  nested structure; this only permutes tensors (no effect on sensitivity or noise).
  """

  def __init__(self, inner: nested_query.NestedSumQuery, groups, value_specs):
    self._inner = inner
    self._groups = [list(g) for g in groups]
    self._specs = value_specs
    self._num_leaves = len(tf.nest.flatten(value_specs))

  @property
  def inner(self):
    return self._inner

  def _group(self, value):
    flat = tf.nest.flatten(value)
    return [[flat[i] for i in g] for g in self._groups]

  def _ungroup(self, grouped):
    flat = [None] * self._num_leaves
    for g, values in zip(self._groups, grouped):
      for i, v in zip(g, values):
        flat[i] = v
    return tf.nest.pack_sequence_as(self._specs, flat)

  def initial_global_state(self):
    return self._inner.initial_global_state()

  def derive_sample_params(self, global_state):
    return self._inner.derive_sample_params(global_state)

  def initial_sample_state(self, template=None):
    return self._inner.initial_sample_state(self._group(template))

  def preprocess_record(self, params, record):
    return self._inner.preprocess_record(params, self._group(record))

  def accumulate_preprocessed_record(self, sample_state, preprocessed_record):
    return self._inner.accumulate_preprocessed_record(sample_state, preprocessed_record)

  def merge_sample_states(self, sample_state_1, sample_state_2):
    return self._inner.merge_sample_states(sample_state_1, sample_state_2)

  def get_noised_result(self, sample_state, global_state):
    result, new_state, event = self._inner.get_noised_result(sample_state, global_state)
    return self._ungroup(result), new_state, event

  def derive_metrics(self, global_state):
    return self._inner.derive_metrics(global_state)


def check_adaptive_args(*, noise_multiplier, clients_per_round, initial_clip,
                        target_unclipped_quantile, clip_learning_rate, update_rule):
  """UserInputError for out-of-range adaptive-clipping settings."""
  if update_rule not in UPDATE_RULES:
    raise UserInputError(f'update rule must be geometric or linear, got {update_rule!r}')
  if not 0 < target_unclipped_quantile < 1:
    raise UserInputError('target_unclipped_quantile must be in (0, 1), got '
                         f'{target_unclipped_quantile}')
  if not initial_clip > 0:
    raise UserInputError(f'initial clip must be positive, got {initial_clip}')
  if not clip_learning_rate > 0:
    raise UserInputError(f'clip_learning_rate must be positive, got {clip_learning_rate}')
  if not clients_per_round > 0:
    raise UserInputError(f'clients_per_round must be positive, got {clients_per_round}')
  if not noise_multiplier >= 0:
    raise UserInputError(f'noise_multiplier must be >= 0, got {noise_multiplier}')


def resolve_count_stddev(noise_multiplier, clipped_count_stddev, clients_per_round):
  """sigma_b: given, else m/20 with noise, else 0 (no noise anywhere, as TFF)."""
  if noise_multiplier == 0 and clipped_count_stddev is None:
    return 0.0
  return budget.resolve_clipped_count_stddev(clipped_count_stddev, clients_per_round)


def unclipped_fraction(clip_used, next_clip, gamma, eta, geometric):
  """The noised unclipped fraction b, recovered by inverting the clip update (it is not kept in
  tfp's state). Exact (b is clamped to [0, 1] before the update) unless the step was clamped:
  in a round where the estimate_floor.MIN_ESTIMATE floor binds, next_clip is above the
  unclamped step, so the result understates b (it can fall below 0)."""
  if geometric:
    return gamma - tf.math.log(next_clip / clip_used) / eta
  return gamma + (clip_used - next_clip) / eta


class PerLayerAdaptiveClipFactory(tff.aggregators.UnweightedAggregationFactory):
  """One adaptive clip per group of tensors (default: per tensor), noise split by Eq. (1).

  `groups`: None (each tensor its own group), a list of lists of flat tensor indices, or a
  function of the list of flat tensor shapes returning one. `noise_allocation`: proportional
  (sigma_g = z_v sqrt(G) S_g) or dimensionality (sigma_g = z_v sqrt(D/d_g) S_g).
  Measurements: privacy_queries {update/group_g, clipped_count/group_g}, clip {group_g},
  next_clip {group_g}, unclipped_fraction_estimate {group_g} (understated in a round where the
  MIN_ESTIMATE floor binds). After create(), the Python attributes `groups` and
  `noise_multipliers` (z_g per group) describe the built process.
  """

  def __init__(self, *, noise_multiplier: float, clients_per_round: float,
               initial_clip: Union[float, Sequence[float]], target_unclipped_quantile: float = 0.5,
               clip_learning_rate: float = 0.2, update_rule: str = 'geometric',
               clipped_count_stddev: Optional[float] = None,
               noise_allocation: str = 'proportional', groups: Groups = None):
    clips = ([float(c) for c in initial_clip] if isinstance(initial_clip, (list, tuple))
             else None)
    check_adaptive_args(noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
                        initial_clip=min(clips) if clips else initial_clip,
                        target_unclipped_quantile=target_unclipped_quantile,
                        clip_learning_rate=clip_learning_rate, update_rule=update_rule)
    if noise_allocation not in NOISE_ALLOCATIONS:
      raise UserInputError(f'noise_allocation must be proportional or dimensionality, got '
                           f'{noise_allocation!r}')
    self.noise_multiplier = float(noise_multiplier)
    self.clients_per_round = float(clients_per_round)
    self.initial_clip = clips if clips else float(initial_clip)
    self.target_unclipped_quantile = float(target_unclipped_quantile)
    self.clip_learning_rate = float(clip_learning_rate)
    self.update_rule = update_rule
    self.clipped_count_stddev = resolve_count_stddev(
        self.noise_multiplier, clipped_count_stddev, clients_per_round)
    self.noise_allocation = noise_allocation
    self._groups = groups
    if not callable(groups) and groups is not None:
      # Budget check up front (the CLI reports it before building anything).
      budget.update_noise_multiplier(self.noise_multiplier, self.clipped_count_stddev,
                                     len(groups))

  def group_noise_multipliers(self, sizes: Sequence[int]) -> list[float]:
    """Per-group update multipliers z_g after the budget split over len(sizes) count queries."""
    z_v = budget.update_noise_multiplier(self.noise_multiplier, self.clipped_count_stddev,
                                         len(sizes))
    return budget.group_noise_multipliers(z_v, sizes, self.noise_allocation)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, shapes = value_specs_and_shapes(value_type)
    groups = resolve_groups(self._groups, shapes)
    sizes = group_sizes(groups, shapes)
    names = group_names(len(groups))
    multipliers = self.group_noise_multipliers(sizes)
    clips = self.initial_clip
    if isinstance(clips, list):
      if len(clips) != len(groups):
        raise UserInputError(f'{len(clips)} initial clips given for {len(groups)} groups')
    else:
      clips = [clips] * len(groups)
    geometric = self.update_rule == 'geometric'
    sub_queries = [
        estimate_floor.FlooredQuantileAdaptiveClipSumQuery(
            initial_l2_norm_clip=c, noise_multiplier=z,
            target_unclipped_quantile=self.target_unclipped_quantile,
            learning_rate=self.clip_learning_rate,
            clipped_count_stddev=self.clipped_count_stddev,
            expected_num_records=self.clients_per_round, geometric_update=geometric)
        for c, z in zip(clips, multipliers)]
    query = tfp.NormalizedQuery(
        RegroupedSumQuery(nested_query.NestedSumQuery(sub_queries), groups, specs),
        denominator=self.clients_per_round)

    def tuples(query_state):
      out = collections.OrderedDict()
      states = [query_state.numerator_state[g] for g in range(len(names))]
      for name, s in zip(names, states):
        out[f'update/{name}'] = privacy_queries.query_tuple(s.sum_state.l2_norm_clip,
                                                            s.sum_state.stddev)
      for name, s in zip(names, states):
        count = s.quantile_estimator_state.below_estimate_state.numerator_state
        out[f'clipped_count/{name}'] = privacy_queries.query_tuple(count.l2_norm_clip,
                                                                   count.stddev)
      return out

    gamma, eta = self.target_unclipped_quantile, self.clip_learning_rate

    def metrics(query_state, inner_measurements):
      # Post-round clips are in TFF's dp_query_metrics, named '<group index>/clip' by tfp.
      dp_metrics = inner_measurements['dp_query_metrics']
      clip, next_clip, fraction = (collections.OrderedDict() for _ in range(3))
      for g, name in enumerate(names):
        used = query_state.numerator_state[g].sum_state.l2_norm_clip
        new = dp_metrics[f'{g}/clip']
        clip[name], next_clip[name] = used, new
        fraction[name] = unclipped_fraction(used, new, gamma, eta, geometric)
      return collections.OrderedDict(clip=clip, next_clip=next_clip,
                                     unclipped_fraction_estimate=fraction)

    self.noise_multipliers = dict(zip(names, multipliers))
    self.groups = groups
    return ReportingDPFactory(query, tuples, metrics).create(value_type)


def build(kind: str, **kwargs):
  """Factory for `build_dp_aggregator` kinds per_layer_adaptive and joint."""
  if kind == 'per_layer_adaptive':
    return PerLayerAdaptiveClipFactory(
        noise_multiplier=kwargs.pop('noise_multiplier'),
        clients_per_round=kwargs.pop('clients_per_round'),
        initial_clip=kwargs.pop('clip'), **kwargs)
  if kind == 'joint':
    from tff_dp.aggregators import joint  # pylint: disable=g-import-not-at-top
    return joint.JointClipFactory(
        noise_multiplier=kwargs.pop('noise_multiplier'),
        clients_per_round=kwargs.pop('clients_per_round'),
        initial_scale=kwargs.pop('clip'), **kwargs)
  raise UserInputError(f'unknown kind {kind!r}')
