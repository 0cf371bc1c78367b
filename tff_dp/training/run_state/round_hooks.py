"""The round loop's extension point: a feature that acts in every round is a `RoundHook`.

The loop (`loop.py`) knows no feature: it calls every hook, in the order the run gives them, at
the same points of the run. Checkpoint aggregates, evaluation and canaries are hooks
(`aggregates_hook.py`, `evaluation_hook.py`, `canary_run.py`); a new one is a subclass in its own
module, added to the list `experiment.build_components` makes. Every method has a default that
does nothing, so a hook implements only the points it needs:

  start(process, state)             a new or resumed run, before anything is restored
  restore(loaded, process, state)   a resumed run: `loaded` is the checkpoint's entries (None:
                                    no checkpoint yet), `state` the restored process state
  split_sample(ids)                 pure: (ids the loop builds data for, ids the hook serves)
  round_values(values, own_ids)     the values `process.next` receives, given the built ones
  before_round(round_num, state)    the state `process.next` receives for the round (a
                                    correlated-noise run writes the round's noise into it)
  after_round(round)                after the round's ledger record and epsilon: add columns to
                                    `round.row`, replace `round.state` (the next round's start)
  checkpoint_entries()              {key: value} a checkpoint holds for the hook, restored into
                                    `restore`'s `loaded` (the keys of all hooks are distinct)
  earlier_checkpoint_entries()      the entries of the checkpoints an earlier version wrote,
                                    which `restore` still takes (default: the current ones)
  checkpoint_state(state)           the process state as a checkpoint holds it (a hook may
                                    leave out what it rebuilds, in the same structure)
  restored_state(state, initial)    the process state a resumed run continues from, given the
                                    checkpoint's and the process's initial state
  finish(report)                    the final report of a finished run: models to ship,
                                    statement entries, files

Privacy: a hook sees the released model and what the loop gives it. A hook that writes a file
or a metrics column declares it in `release.py` first (an undeclared one is refused there).
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence


@dataclasses.dataclass
class Round:
  """One completed round, as the hooks see it after its ledger record and epsilon.

  `state` starts as `trained_state` (the process output); a hook may replace it with the state
  the next round starts from (training on a checkpoint aggregate). `weights()`: the flat model
  weights of `trained_state`, computed on first use.
  """
  num: int
  is_last: bool
  is_eval: bool            # An evaluation round: every `rounds_per_eval`-th, and the last.
  trained_state: Any
  state: Any
  row: dict
  weights_fn: Callable[[], list]
  _weights: Optional[list] = None

  def weights(self) -> list:
    if self._weights is None:
      self._weights = self.weights_fn()
    return self._weights


@dataclasses.dataclass
class FinalReport:
  """What hooks add to the final report of a finished run.

  models: {name: flat weights} a private release ships (the loop adds 'last_iterate').
  statement: entries added to the privacy statement (e.g. 'empirical_estimate').
  uncertainty: the last-k uncertainty report, when a hook wrote uncertainty.json.
  model_labels: {model name in the eval columns (eval_<name>_<metric>): what it is}, for the
  plots' legends (e.g. 'past_k': 'average of the last 3 models').
  """
  run_dir: Any
  final_state: Any
  delta: float
  facts: Any               # release.RunFacts
  models: dict = dataclasses.field(default_factory=dict)
  statement: dict = dataclasses.field(default_factory=dict)
  uncertainty: Optional[dict] = None
  model_labels: dict = dataclasses.field(default_factory=dict)


class RoundHook:
  """A feature's part in every round (see the module docstring for when each method runs)."""

  def start(self, process, state) -> None:
    del process, state

  def restore(self, loaded: Optional[Mapping[str, Any]], process, state) -> None:
    del loaded, process, state

  def split_sample(self, client_ids: Sequence[Any]) -> tuple[list, list]:
    return list(client_ids), []

  def round_values(self, values: Sequence[Any], own_ids: Sequence[Any]) -> list:
    del own_ids
    return list(values)

  def before_round(self, round_num: int, state: Any) -> Any:
    del round_num
    return state

  def after_round(self, round_: Round) -> None:
    del round_

  def checkpoint_entries(self) -> dict[str, Any]:
    return {}

  def earlier_checkpoint_entries(self) -> dict[str, Any]:
    return self.checkpoint_entries()

  def checkpoint_state(self, state: Any) -> Any:
    return state

  def restored_state(self, state: Any, initial_state: Any) -> Any:
    del initial_state
    return state

  def finish(self, report: FinalReport) -> None:
    del report
