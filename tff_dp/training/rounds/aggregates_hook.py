"""Checkpoint aggregates (EMA, past-k; Recycling Scraps) as a round hook: updated with each
round's model, checkpointed and restored with the run, optionally the model the next round
trains from (Algorithm 1), and shipped in a private release. Post-processing of released
models: free in privacy."""

import collections
from typing import Any, Mapping, Optional

from tff_dp import checkpoint_aggregation as ca
from tff_dp.training.run_state import round_hooks

# The checkpoint entry (a checkpoint always holds it, empty without aggregates: the layout of
# every run's checkpoints is the same).
ENTRY = 'aggregates'


class AggregatesHook(round_hooks.RoundHook):
  """`aggregates`: {name: EMAAggregate | PastKAverage}; `policy`: TrainOnAggregate or None."""

  def __init__(self, aggregates: Mapping[str, Any],
               policy: Optional[ca.TrainOnAggregate] = None):
    self.aggregates = collections.OrderedDict(aggregates)
    self.policy = policy
    self._process = None

  def start(self, process, state) -> None:
    del state
    self._process = process

  def restore(self, loaded, process, state) -> None:
    del process, state
    if loaded is not None:
      for name, agg in self.aggregates.items():
        agg.set_state(loaded[ENTRY][name])

  def after_round(self, round_: round_hooks.Round) -> None:
    if not self.aggregates and self.policy is None:
      return
    weights = round_.weights()
    for agg in self.aggregates.values():
      agg.update(weights)
    if self.policy is not None:
      start_weights = self.policy.select(round_.num, weights, self.aggregates)
      if start_weights is not weights:
        round_.state = self.policy.apply(self._process, round_.state, start_weights)
        round_.row['trained_from_aggregate'] = 1

  def models(self) -> dict[str, list]:
    """{name: flat weights} of the aggregates that have a value."""
    return {name: agg.value() for name, agg in self.aggregates.items()
            if agg.value() is not None}

  def checkpoint_entries(self) -> dict[str, Any]:
    return {ENTRY: collections.OrderedDict(
        (name, agg.get_state()) for name, agg in self.aggregates.items())}

  def finish(self, report: round_hooks.FinalReport) -> None:
    report.models.update(self.models())
    report.model_labels.update({name: agg.label for name, agg in self.aggregates.items()})
