"""`tff_dp.run(config)`: a whole run from an `ExperimentConfig` alone.

Sets up where TFF computes (the local C++ worker, or remote workers: `config.runtime`), builds
the task with its data (`tasks.load`: the embedded dataset when `data_dir` is unset), then runs
or resumes the experiment (`tff_dp.training.experiment.run`, which takes a task object for
callers that build their own).
"""

import contextlib
from typing import Optional

import tasks
from tff_dp import distributed
from tff_dp import worker_addresses
from tff_dp import runtime
from tff_dp.training import components
from tff_dp.training import experiment
from tff_dp.training import preflight
from tff_dp.training import stop_signal
from tff_dp.training import task_protocol
from tff_dp.training.config import ExperimentConfig


def configure_execution(cfg: ExperimentConfig) -> None:
  """Installs the TFF execution context `cfg.runtime` describes."""
  settings = cfg.runtime
  if settings.workers:
    distributed.install_worker_context(
        worker_addresses.parse_workers(settings.workers),
        unavailable_timeout=settings.worker_unavailable_timeout,
        rpc_timeout=settings.worker_rpc_timeout)
  else:
    runtime.configure_execution_context(
        max_concurrent_computation_calls=settings.max_concurrent_computation_calls,
        client_slices=settings.client_slices)


def load_task(cfg: ExperimentConfig):
  """The task `cfg.task` describes, from its data directory or the embedded dataset."""
  t = cfg.task
  return tasks.load(t.name, t.data_dir, embedded_data_dir=t.embedded_data_dir,
                    client_batch_size=t.client_batch_size,
                    client_epochs=t.client_epochs_per_round,
                    max_elements_per_client=t.max_elements_per_client,
                    shuffle_seed=cfg.training.seed, **t.task_options())


def run(cfg: ExperimentConfig, *, task=None, log=print,
        stop: Optional[stop_signal.StopSignal] = None) -> components.RunSummary:
  """Runs (or, with `output.resume`, resumes) the experiment `cfg` describes; returns how it
  ended (`RunSummary`: `run_dir`, `rounds_completed`, ...).

  `task`: your own task (an object implementing `tff_dp.training.task_protocol`), trained as it
  is; None builds the registered task `cfg.task` names, from its settings.

  Bad settings or data raise `tff_dp.errors.UserInputError` before anything is written; a
  fault during the run raises `RunFailedError` with the run directory consistent. `log`
  receives the console lines; `stop`: see `tff_dp.training.experiment.run`.
  """
  if task is None:   # A registered task: every refusal that needs no TensorFlow, first.
    preflight.check(cfg)
  cfg.validate()
  runtime.manage_workers()   # No TFF worker outlives the program, whatever ends it.
  with _quiet_logs():
    configure_execution(cfg)
    task = load_task(cfg) if task is None else task_protocol.check(task)
    return experiment.run(cfg, task, log=log, stop=stop)


@contextlib.contextmanager
def _quiet_logs():
  """TensorFlow's and absl's INFO lines off while the run lasts (the console is one line per
  round, as the command line has it), restored after: a library call leaves the process's
  logging as it found it."""
  from absl import logging   # pylint: disable=g-import-not-at-top
  import tensorflow as tf   # pylint: disable=g-import-not-at-top
  absl_level, tf_level = logging.get_verbosity(), tf.get_logger().level
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
  try:
    yield
  finally:
    logging.set_verbosity(absl_level)
    tf.get_logger().setLevel(tf_level)
