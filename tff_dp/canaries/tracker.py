"""A run's canary statistics over rounds, and its two empirical epsilon estimates.

The loop hands the tracker each round's model weights before and after the round; the tracker
keeps what the two threat models need (Andrew et al., ICLR 2024, Sec. 4):

* final model: the initial weights, so that the total change is initial minus current weights;
* all iterates: per canary (inserted and unseen), the running maximum over rounds of the cosine
  with that round's change (start minus end weights of the round).

Orientation: TFF's client update is initial minus trained weights and the server subtracts the
aggregate, so an inserted canary c moves the model along -c: the change "before minus after"
has a positive cosine with c (the paper code's "negative cosines").

`get_state()` / `set_state()` hold exactly this (no key: the directions come from the run's
key file), so a resumed run continues the same statistics.
"""

import collections
import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from tff_dp.canaries import bootstrap
from tff_dp.canaries import directions as directions_lib
from tff_dp.canaries import estimate
from tff_dp.canaries import scores as scores_lib

# The fewest inserted (final model) or unseen (all iterates) canaries a run reports an estimate
# for. A Gaussian fit needs 2, but with a handful it carries no information: at K = 5 a run
# printed 77.2 against a proven 3.65, with a bootstrap "95% interval" wholly above the proven
# bound. Below this the run reports no point value (the statement says why).
MIN_CANARIES_FOR_AN_ESTIMATE = 20


class CanaryTracker:
  """Statistics of `directions`' canaries over a run that starts from `initial_weights`
  (the trainable weights as a list of arrays, in the order of the canaries' dimension)."""

  def __init__(self, directions: directions_lib.CanaryDirections,
               initial_weights: Sequence[Any]):
    self.directions = directions
    self._initial = self._flat(initial_weights)
    self._max = {group: np.full(directions.count(group), -np.inf)
                 for group in directions_lib.GROUPS}
    self.rounds_observed = 0

  def _flat(self, weights: Sequence[Any]) -> np.ndarray:
    flat = directions_lib.flatten(weights)
    if flat.size != self.directions.dim:
      raise ValueError(f'model weights have {flat.size} entries, the canaries '
                       f'{self.directions.dim}')
    return flat

  def observe_round(self, start_weights: Sequence[Any], end_weights: Sequence[Any]) -> None:
    """Adds one round: the model it started from and the model it produced."""
    change = self._flat(start_weights) - self._flat(end_weights)
    for group, cosines in self.directions.cosines(change).items():
      np.maximum(self._max[group], cosines, out=self._max[group])
    self.rounds_observed += 1

  def final_model_estimate(self, weights: Sequence[Any],
                           delta: float) -> Optional[estimate.CanaryEstimate]:
    """The paper's final-model estimate for the model `weights` (closed-form null); None with
    fewer than MIN_CANARIES_FOR_AN_ESTIMATE inserted canaries."""
    if self.directions.num_inserted < MIN_CANARIES_FOR_AN_ESTIMATE:
      return None
    return estimate.epsilon_from_cosines_closed_form_null(self._final_cosines(weights),
                                                          self.directions.dim, delta)

  def _final_cosines(self, weights: Sequence[Any]) -> np.ndarray:
    """The inserted canaries' cosines with the total change from the initial model."""
    return self.directions.cosines(self._initial - self._flat(weights))[directions_lib.INSERTED]

  def scores(self, weights: Sequence[Any]) -> scores_lib.Scores:
    """Every canary's scores for the model `weights` (inserted canaries first, then the
    unseen): its cosine with the total change from the initial model, and its largest cosine
    with one round's change so far (-inf before the first round)."""
    final = self.directions.cosines(self._initial - self._flat(weights))
    groups = directions_lib.GROUPS
    return scores_lib.Scores(
        inserted=np.concatenate([np.full(self.directions.count(g), g == directions_lib.INSERTED)
                                 for g in groups]),
        final_model=np.concatenate([final[g] for g in groups]).astype(np.float64),
        all_iterates=np.concatenate([self._max[g] for g in groups]).astype(np.float64))

  def all_iterates_estimate(self, delta: float) -> Optional[estimate.CanaryEstimate]:
    """The all-iterates estimate over the rounds observed; None before the first round or with
    fewer than MIN_CANARIES_FOR_AN_ESTIMATE inserted or unseen canaries (its null is
    fitted to the unseen ones)."""
    if (self.rounds_observed == 0 or self.directions.num_inserted < MIN_CANARIES_FOR_AN_ESTIMATE
        or self.directions.num_unseen < MIN_CANARIES_FOR_AN_ESTIMATE):
      return None
    return estimate.all_iterates_epsilon(self._max[directions_lib.INSERTED],
                                         self._max[directions_lib.UNSEEN], delta)

  def final_model_interval(self, weights: Sequence[Any], delta: float
                           ) -> Optional[bootstrap.EstimateInterval]:
    """The bootstrap interval of `final_model_estimate` (None where that is None)."""
    if self.directions.num_inserted < MIN_CANARIES_FOR_AN_ESTIMATE:
      return None
    return bootstrap.bootstrap_interval(self._final_cosines(weights), delta,
                                       null=(0.0, 1.0 / math.sqrt(self.directions.dim)))

  def all_iterates_interval(self, delta: float) -> Optional[bootstrap.EstimateInterval]:
    """The bootstrap interval of `all_iterates_estimate` (None where that is None)."""
    if self.all_iterates_estimate(delta) is None:
      return None
    return bootstrap.bootstrap_interval(self._max[directions_lib.INSERTED], delta,
                                       unseen=self._max[directions_lib.UNSEEN])

  def get_state(self) -> collections.OrderedDict:
    """What a checkpoint keeps (numpy arrays; the key is not among them)."""
    return collections.OrderedDict(
        initial=self._initial.astype(np.float32),
        max_inserted=self._max[directions_lib.INSERTED].copy(),
        max_unseen=self._max[directions_lib.UNSEEN].copy(),
        rounds_observed=np.int64(self.rounds_observed))

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Restores what `get_state` returned (a resumed run)."""
    initial = np.asarray(state['initial'], dtype=np.float64).reshape(-1)
    if initial.size != self.directions.dim:
      raise ValueError(f'canary state has {initial.size} initial weights, the canaries '
                       f'{self.directions.dim}')
    self._initial = initial
    for group, key in ((directions_lib.INSERTED, 'max_inserted'),
                       (directions_lib.UNSEEN, 'max_unseen')):
      values = np.asarray(state[key], dtype=np.float64).reshape(-1)
      if values.size != self.directions.count(group):
        raise ValueError(f'canary state has {values.size} {group} maxima, the run '
                         f'{self.directions.count(group)} {group} canaries')
      self._max[group] = values.copy()
    self.rounds_observed = int(state['rounds_observed'])
