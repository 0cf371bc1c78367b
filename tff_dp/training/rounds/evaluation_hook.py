"""Central evaluation as a round hook: the round's model and each checkpoint aggregate on
evaluation rounds (`eval_*` columns), and the last-k models kept for the uncertainty report
(uncertainty.json) of a finished run."""

import math
from typing import Any, Callable, Mapping

import numpy as np

from tff_dp import checkpoint_aggregation as ca
from tff_dp.training.builders import evaluation
from tff_dp.training.run_state import round_hooks

# The checkpoint entry of the last-k models (present, empty, without the uncertainty report).
# They are kept as a past-k buffer, whose checkpoint state has the same keys before the first
# round as after it (a list of models grew, and a resume could not restore it into the empty
# list of a fresh run).
ENTRY = 'recent'


class EvaluationHook(round_hooks.RoundHook):
  """`aggregate_models()`: {name: flat weights} of the checkpoint aggregates to evaluate too;
  `uncertainty_last_k`: models kept for the uncertainty report (0: none)."""

  def __init__(self, evaluator: evaluation.CentralizedEvaluator,
               aggregate_models: Callable[[], Mapping[str, Any]] = dict,
               uncertainty_last_k: int = 0):
    self.evaluator = evaluator
    self._aggregate_models = aggregate_models
    self.uncertainty_last_k = uncertainty_last_k
    self.recent = ca.PastKAverage(uncertainty_last_k) if uncertainty_last_k else None

  def restore(self, loaded, process, state) -> None:
    del process, state
    if loaded is not None and self.recent is not None:
      self.recent.set_state(loaded[ENTRY])

  def after_round(self, round_: round_hooks.Round) -> None:
    if self.recent is not None:
      self.recent.update(round_.weights())
    if not round_.is_eval:
      return
    for name, value in self.evaluator.evaluate(round_.weights()).items():
      round_.row[f'eval_{name}'] = value
    for agg_name, weights in self._aggregate_models().items():
      for name, value in self.evaluator.evaluate(weights).items():
        round_.row[f'eval_{agg_name}_{name}'] = value

  def checkpoint_entries(self) -> dict[str, Any]:
    return {ENTRY: self.recent.get_state() if self.recent is not None else []}

  def finish(self, report: round_hooks.FinalReport) -> None:
    """Writes uncertainty.json: per-example scores and labels are never covered, so a private
    release keeps only the widths, and only when evaluation is covered."""
    facts = report.facts
    if (self.recent is None or self.recent.count < 2
        or (facts.private_release and not facts.eval_covered)):
      return
    recent = self.recent.models()
    accuracies = np.array([self.evaluator.evaluate(w).get('accuracy', math.nan)
                           for w in recent])
    scores = np.stack([self.evaluator.predict_scores(w) for w in recent])
    limit = {'max_per_example_values': 0} if facts.private_release else {}
    report.uncertainty = ca.write_uncertainty_report(
        report.run_dir.file('uncertainty.json'), accuracy=accuracies, prediction_scores=scores,
        **limit)
