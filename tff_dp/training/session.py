"""The TensorFlow side of `tff_dp.run`: the execution context, the task, the experiment.

Imported by `api.run` only once the checks that need no TensorFlow have passed, and inside
`native_logs.held_back`, so that TensorFlow's import-time log lines are held back too.
"""

import contextlib
from typing import Optional

from absl import logging
import tensorflow as tf

from tff_dp.execution import distributed
from tff_dp.execution import runtime
from tff_dp.execution import worker_addresses
from tff_dp.training import experiment
from tff_dp.training import task_protocol
from tff_dp.training import task_registry
from tff_dp.training.builders import components
from tff_dp.training.config import ExperimentConfig
from tff_dp.training.run_state import stop_signal


def run(cfg: ExperimentConfig, task, *, log,
        stop: Optional[stop_signal.StopSignal]) -> components.RunSummary:
  """`tff_dp.run` once `cfg` is checked: `task` None builds the registered task `cfg.task`."""
  with _quiet_python_logs():
    configure_execution(cfg)
    task = load_task(cfg) if task is None else task_protocol.check(task)
    return experiment.run(cfg, task, log=log, stop=stop)


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
  return task_registry.get(t.name).build(
      t.data_dir, embedded_data_dir=t.embedded_data_dir, client_batch_size=t.client_batch_size,
      client_epochs=t.client_epochs_per_round,
      max_elements_per_client=t.max_elements_per_client, shuffle_seed=cfg.training.seed,
      **cfg.task_options())


@contextlib.contextmanager
def _quiet_python_logs():
  """TensorFlow's and absl's Python INFO lines off while the run lasts (the console is one line
  per round, as the command line has it), restored after: a library call leaves the process's
  logging as it found it."""
  absl_level, tf_level = logging.get_verbosity(), tf.get_logger().level
  logging.set_verbosity(logging.WARNING)
  tf.get_logger().setLevel('ERROR')
  try:
    yield
  finally:
    logging.set_verbosity(absl_level)
    tf.get_logger().setLevel(tf_level)
