"""Per-layer (per-group) adaptive clipping: one clip and one quantile estimate per group.

Each group of tensors gets its own tensorflow_privacy `QuantileAdaptiveClipSumQuery` (clip,
sum, noise, DP quantile update; its clip kept >= `estimate_floor.MIN_ESTIMATE`, see there),
combined with tfp's `NestedSumQuery` (records regrouped by `groups.RegroupedSumQuery`) and run
by TFF's `DifferentiallyPrivateFactory`.

Noise allocation follows the ledger paper (McMahan et al. 2018): the adaptive budget split over
the G count queries, then proportional or dimensionality allocation (formulas in
`tff_dp.noise_budget`), so that by Eq. (1) the round's effective multiplier is z.
"""

import collections
from typing import Optional, Sequence, Union

import tensorflow_federated as tff
import tensorflow_privacy as tfp
from tensorflow_privacy.privacy.dp_query import nested_query

from tff_dp import noise_budget
from tff_dp.aggregators import estimate_floor
from tff_dp.aggregators import groups as groups_lib
from tff_dp.aggregators import privacy_queries
from tff_dp import adaptive_clipping
from tff_dp.aggregators import quantile_clipping
from tff_dp.aggregators import reporting
from tff_dp.aggregators.reporting import ReportingDPFactory
from tff_dp.errors import UserInputError


_DEFAULT = adaptive_clipping.AdaptiveClipping()


class PerLayerAdaptiveClipFactory(tff.aggregators.UnweightedAggregationFactory):
  """One adaptive clip per group of tensors (default: per tensor), noise split by Eq. (1).

  `groups`: None (each tensor its own group), a list of lists of flat tensor indices, or a
  function of the list of flat tensor shapes returning one. `noise_allocation`: proportional
  (sigma_g = z_v sqrt(G) S_g) or dimensionality (sigma_g = z_v sqrt(D/d_g) S_g).
  Measurements: privacy_queries {update/group_g, clipped_count/group_g}, clip {group_g},
  next_clip {group_g}, unclipped_fraction_estimate {group_g} (understated in a round where the
  MIN_ESTIMATE floor binds). `groups_for(shapes)` and `group_noise_multipliers(sizes)` say
  how a model of given shapes is grouped and noised.
  """

  def __init__(self, *, noise_multiplier: float, clients_per_round: float,
               initial_clip: Union[float, Sequence[float]],
               adaptive: adaptive_clipping.AdaptiveClipping = _DEFAULT,
               noise_allocation: str = 'proportional', groups: groups_lib.Groups = None):
    clips = ([float(c) for c in initial_clip] if isinstance(initial_clip, (list, tuple))
             else None)
    quantile_clipping.check_adaptive_args(
        noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
        initial_clip=min(clips) if clips else initial_clip)
    noise_budget.check_noise_allocation(noise_allocation)
    self.adaptive = adaptive
    self.noise_multiplier = float(noise_multiplier)
    self.clients_per_round = float(clients_per_round)
    self.initial_clip = clips if clips else float(initial_clip)
    self.clipped_count_stddev = quantile_clipping.resolve_count_stddev(
        self.noise_multiplier, adaptive.clipped_count_stddev, clients_per_round)
    self.noise_allocation = noise_allocation
    self._groups = groups
    if not callable(groups) and groups is not None:
      # Budget check up front (the CLI reports it before building anything).
      noise_budget.update_noise_multiplier(self.noise_multiplier, self.clipped_count_stddev,
                                     len(groups))

  def group_noise_multipliers(self, sizes: Sequence[int]) -> list[float]:
    """Per-group update multipliers z_g after the budget split over len(sizes) count queries."""
    z_v = noise_budget.update_noise_multiplier(self.noise_multiplier, self.clipped_count_stddev,
                                         len(sizes))
    return noise_budget.group_noise_multipliers(z_v, sizes, self.noise_allocation)

  def groups_for(self, shapes) -> list[list[int]]:
    """The groups (flat tensor indices) this factory clips separately for tensors of these
    shapes: a pure function of its settings, the one `create` uses."""
    return groups_lib.resolve_groups(self._groups, list(shapes))

  def measurements(self) -> tuple[reporting.Measurement, ...]:
    """Each adaptive-clip measurement holds one value per group."""
    return reporting.declare(quantile_clipping.ADAPTIVE_CLIP_MEASUREMENTS)

  def create(self, value_type) -> tff.templates.AggregationProcess:
    specs, shapes = groups_lib.value_specs_and_shapes(value_type)
    groups = self.groups_for(shapes)
    sizes = groups_lib.group_sizes(groups, shapes)
    names = groups_lib.group_names(len(groups))
    multipliers = self.group_noise_multipliers(sizes)
    clips = self.initial_clip
    if isinstance(clips, list):
      if len(clips) != len(groups):
        raise UserInputError(f'{len(clips)} initial clips given for {len(groups)} groups')
    else:
      clips = [clips] * len(groups)
    geometric = self.adaptive.geometric
    sub_queries = [
        estimate_floor.FlooredQuantileAdaptiveClipSumQuery(
            initial_l2_norm_clip=c, noise_multiplier=z,
            target_unclipped_quantile=self.adaptive.target_unclipped_quantile,
            learning_rate=self.adaptive.clip_learning_rate,
            clipped_count_stddev=self.clipped_count_stddev,
            expected_num_records=self.clients_per_round, geometric_update=geometric)
        for c, z in zip(clips, multipliers)]
    query = tfp.NormalizedQuery(
        groups_lib.RegroupedSumQuery(nested_query.NestedSumQuery(sub_queries), groups, specs),
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

    gamma, eta = self.adaptive.target_unclipped_quantile, self.adaptive.clip_learning_rate

    def metrics(query_state, inner_measurements):
      # Post-round clips are in TFF's dp_query_metrics, named '<group index>/clip' by tfp.
      dp_metrics = inner_measurements['dp_query_metrics']
      clip, next_clip, fraction = (collections.OrderedDict() for _ in range(3))
      for g, name in enumerate(names):
        used = query_state.numerator_state[g].sum_state.l2_norm_clip
        new = dp_metrics[f'{g}/clip']
        clip[name], next_clip[name] = used, new
        fraction[name] = quantile_clipping.unclipped_fraction(used, new, gamma, eta, geometric)
      return collections.OrderedDict(clip=clip, next_clip=next_clip,
                                     unclipped_fraction_estimate=fraction)

    return ReportingDPFactory(query, tuples, metrics,
                              extra_measurements=quantile_clipping.ADAPTIVE_CLIP_MEASUREMENTS
                              ).create(value_type)

