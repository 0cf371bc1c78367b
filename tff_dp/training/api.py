"""`tff_dp.run(config)`: a whole run from an `ExperimentConfig` alone.

Checks everything that needs no TensorFlow first (`preflight`), then, with the native loggers'
lines held back (`tff_dp.execution.native_logs`), sets up where TFF computes (the local C++
worker, or remote workers: `config.runtime`), builds the task with its data (`tasks.load`: the embedded
dataset when `data_dir` is unset) and runs or resumes the experiment (`training.session`).
"""

from typing import Optional

from tff_dp.errors import UserInputError
from tff_dp.execution import native_logs
from tff_dp.execution import runtime
from tff_dp.training import preflight
from tff_dp.training.config import ExperimentConfig
from tff_dp.training.run_state import stop_signal


def run(cfg: ExperimentConfig, *, task=None, log=print,
        stop: Optional[stop_signal.StopSignal] = None):
  """Runs (or, with `output.resume`, resumes) the experiment `cfg` describes; returns how it
  ended (`tff_dp.training.builders.components.RunSummary`: `run_dir`, `rounds_completed`, ...).

  `task`: your own task (an object implementing `tff_dp.training.task_protocol`), trained as it
  is; None builds the registered task `cfg.task` names, from its settings.

  Bad settings or data raise `tff_dp.errors.UserInputError` before anything is written; a
  fault during the run raises `RunFailedError` with the run directory consistent. `log`
  receives the console lines; `stop`: see `tff_dp.training.experiment.run`. TensorFlow's,
  gRPC's and absl's own log lines are held back while the run lasts, unless
  `cfg.runtime.native_logs`.
  """
  if not isinstance(cfg, ExperimentConfig):
    raise UserInputError(f'`run` takes an ExperimentConfig, got {type(cfg).__name__} '
                         f'{cfg!r:.60}')
  if task is None:   # A registered task: every refusal that needs no TensorFlow, first.
    preflight.check(cfg)
  cfg.validate()
  with native_logs.held_back(not cfg.runtime.native_logs):   # From TensorFlow's import on.
    runtime.manage_workers()   # No TFF worker outlives the program, whatever ends it.
    # pylint: disable=g-import-not-at-top  (TensorFlow's import-time lines are held back too)
    from tff_dp.training import session
    return session.run(cfg, task, log=log, stop=stop)
