"""What the round loop takes (`LoopConfig`, `LoopComponents`) and returns (`RunSummary`).

In their own module so that the loop, resume and the final report share them without importing
each other; `tff_dp.training.experiment.build_components` builds them from a config and a task.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional, Sequence

from tff_dp.run_format import release
from tff_dp.training.builders import evaluation
from tff_dp.training.run_state import privacy_recorder
from tff_dp.training.run_state import round_hooks


@dataclasses.dataclass
class LoopConfig:
  total_rounds: int
  rounds_per_eval: int = 1
  rounds_per_checkpoint: int = 1
  delta: float = 1e-5
  max_epsilon: Optional[float] = None
  dp: str = 'adaptive'              # The DP aggregation kind; 'none' for no DP.
  # What the run's outputs are, privacy-wise (`release.RunFacts`: private_release among them).
  release_facts: release.RunFacts = dataclasses.field(default_factory=release.RunFacts)
  # How the statement describes the evaluation data (a key of privacy_statement._EVAL_TEXT).
  eval_description: str = 'test_shared'
  side_information: Optional[str] = None   # Where AdaDPS side information came from.
  client_cache_size: int = 1000     # Preprocessed client datasets kept (0: rebuild each round).
  prefetch_clients: bool = True     # Build round r+1's client datasets while round r runs.
  # Replace the local TFF worker by a fresh process after every N-th round (0: never).
  worker_restart_rounds: int = 0

  @property
  def private_release(self) -> bool:
    """Keep non-private diagnostics out of every output, and write release/."""
    return self.release_facts.private_release


@dataclasses.dataclass
class LoopComponents:
  """Everything the loop drives; built by `tff_dp.training.experiment` (or by a user)."""
  process: Any                                   # tff.learning.templates.LearningProcess
  run_dir: Any                                   # run_dir.RunDirectory (created)
  sampler: Any                                   # tff_dp.sampling sampler
  client_dataset_fn: Callable[[Any], Any]        # client id -> preprocessed tf.data.Dataset
  # The ledger and accountant (`privacy_recorder.PrivacyRecorder`), or `NO_DP`.
  privacy: Any = privacy_recorder.NO_DP
  # Features acting in every round, in order (`round_hooks.RoundHook`): checkpoint aggregates,
  # evaluation, canaries, ...
  hooks: Sequence[round_hooks.RoundHook] = ()
  # Writes the models of a private release (`CentralizedEvaluator.save_model`); None: none.
  evaluator: Optional[evaluation.CentralizedEvaluator] = None
  log: Callable[[str], None] = print
  # dataset -> reason it cannot be trained on, or None (see client_data.check_client_dataset).
  check_client_fn: Optional[Callable[[Any], Optional[str]]] = None
  # Per-group clip factories: 'group_g' -> the names of its weights (labels in the clip plot).
  clip_group_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # (client id, checked dataset) -> what `process.next` receives for an accepted client; None:
  # the dataset. The id when `process` builds the datasets on the workers.
  client_value_fn: Optional[Callable[[Any, Any], Any]] = None


@dataclasses.dataclass
class RunSummary:
  """How a run (or this part of a resumed run) ended.

  A run stopped by a signal is not finished: it has no `privacy` statement and no summary.json,
  and `resume` continues it.
  """
  rounds_completed: int                 # The last completed round (of the whole run).
  # The learning process state after that round (the model: left out of the repr).
  final_state: Any = dataclasses.field(default=None, repr=False)
  stopped_by_max_epsilon: bool = False  # Stopped before a round that would exceed max_epsilon.
  stopped_by_signal: Optional[str] = None   # e.g. 'SIGINT'; None: not stopped by a signal.
  # The privacy statement (privacy_statement.statement), also in summary.json.
  privacy: Optional[dict[str, Any]] = dataclasses.field(default=None, repr=False)
  # The last-k checkpoint uncertainty report (uncertainty.json), when one was asked for.
  uncertainty: Optional[dict[str, Any]] = dataclasses.field(default=None, repr=False)
  run_dir: Optional[str] = None         # The run directory (set by `experiment.run`).
