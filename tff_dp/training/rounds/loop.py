"""The round loop: sample, run a FedAvg round, ledger, epsilon, metrics, checkpoints.

Order inside a round (see docs/ARCHITECTURE.md): the ledger record is made durable before any
output of the round (metrics, console, checkpoint) is released, so the ledger never under-counts.
Resuming is `resume.py`, the checkpoint layout `checkpointing.py`, the console line and the
final report `report.py`.
"""

import concurrent.futures
import contextlib
import dataclasses
import time
from typing import Any, Mapping, Optional

import numpy as np

from tff_dp import checkpoint_aggregation as ca
from tff_dp import errors
from tff_dp.execution import heap
from tff_dp.execution import runtime
from tff_dp.run_format import release
from tff_dp.training.builders import client_data as client_data_lib
from tff_dp.training.builders import components
from tff_dp.training.builders import evaluation
from tff_dp.training.report import report
from tff_dp.training.run_state import checkpointing
from tff_dp.training.run_state import resume
from tff_dp.training.run_state import round_hooks
from tff_dp.training.run_state import run_dir as run_dir_lib
from tff_dp.training.run_state import stop_signal


def run_training(config: components.LoopConfig, c: components.LoopComponents,
                 stop: Optional[stop_signal.StopSignal] = None) -> components.RunSummary:
  """Runs (or resumes) training; returns how it ended, with the final report of a finished run.

  `stop`: an installed StopSignal (None: one is installed for the duration of training).
  """
  progress = _start(c)
  client_data = client_data_lib.ClientDatasets(
      c.client_dataset_fn, config.client_cache_size, config.prefetch_clients,
      check_fn=c.check_client_fn, value_fn=c.client_value_fn)
  with contextlib.ExitStack() as stack:
    if stop is None:
      stop = stack.enter_context(stop_signal.StopSignal(c.log))
    stop.rounds_started = True
    try:
      ending = _Rounds(config, c, client_data, stop, progress).run()
    finally:
      client_data.close()
  summary = dataclasses.replace(ending, rounds_completed=progress.round_num,
                                final_state=progress.state)
  if summary.stopped_by_signal:
    return summary   # Not finished: no final report, no summary.json; `resume` continues.
  return report.write_final_report(config, c, summary)


def _start(c: components.LoopComponents) -> checkpointing.Progress:
  """The last completed round: round 0 for a new run; for a resumed run, its checkpoint, with
  the hooks restored and the ledger reconciled and replayed into the accountant."""
  state = c.process.initialize()
  for hook in c.hooks:
    hook.start(c.process, state)
  if not c.run_dir.resume:
    return checkpointing.Progress(round_num=0, state=state, checkpointed=0)
  round_num, state = resume.restore(c.run_dir, c.process, state, c.hooks, c.log)
  c.privacy.resume(c.run_dir, round_num, c.log)
  return checkpointing.Progress(round_num=round_num, state=state, checkpointed=round_num)


class _Rounds:
  """Runs rounds progress.round_num+1..total_rounds; `progress` tracks the last completed one."""

  def __init__(self, config: components.LoopConfig, c: components.LoopComponents,
               client_data: client_data_lib.ClientDatasets, stop: stop_signal.StopSignal,
               progress: checkpointing.Progress):
    self.config, self.c, self.client_data, self.stop = config, c, client_data, stop
    self.progress = progress

  def run(self) -> components.RunSummary:
    """How the rounds ended (`rounds_completed` and `final_state` are in `progress`)."""
    try:
      return self._run_rounds()
    except (KeyboardInterrupt, SystemExit) as e:
      if self.stop.received is None:
        raise
      # A second signal aborted a round (or a write): the completed rounds are kept, so that
      # `resume` re-executes nothing that was released.
      raise errors.RunInterrupted(
          self.stop.received, f'aborted by a second {self.stop.name}: '
          f'{_in_a_new_thread(self._kept_rounds)}') from e

  def _run_rounds(self) -> components.RunSummary:
    config, progress = self.config, self.progress
    for round_num in range(progress.round_num + 1, config.total_rounds + 1):
      if self.stop.received is not None:
        self.c.log(f'stopped by {self.stop.name}: {self._kept_rounds()}')
        return self._ending(stopped_by_signal=self.stop.name)
      if config.max_epsilon is not None:
        predicted = self.c.privacy.predicted_epsilon(round_num)
        if predicted is not None and predicted > config.max_epsilon:
          self.c.log(f'stopping before round {round_num}: epsilon would reach {predicted:.4g} '
                     f'> `max_epsilon={config.max_epsilon:g}`; {self._kept_rounds()} '
                     '(after raising `max_epsilon`)')
          return self._ending(stopped_by_max_epsilon=True)
      self._run_one_round(round_num)
    if self.stop.received is not None and progress.round_num < config.total_rounds:
      # The last round was abandoned by the signal.
      self.c.log(f'stopped by {self.stop.name}: {self._kept_rounds()}')
      return self._ending(stopped_by_signal=self.stop.name)
    return self._ending()

  def _kept_rounds(self) -> str:
    """Checkpoints the last completed round (if it was not) and says what a resume does."""
    done, checkpointed = self.progress.round_num, self.progress.checkpointed
    if checkpointed > done:   # An abort between a round's checkpoint and its outputs.
      return (f'rounds 1-{done} are kept, and round {checkpointed}\'s checkpoint was written '
              f'before its outputs were cut short: `resume` continues at round '
              f'{checkpointed + 1}, and round {checkpointed} has no metrics row (its ledger '
              'record stays counted)')
    if checkpointing.save_completed_rounds(self.c.run_dir, self.c.hooks, self.progress,
                                           self.c.log):
      return (f'rounds 1-{done} are kept (checkpoint, ledger and metrics agree); `resume` '
              f'continues at round {done + 1}' if done else
              'no round had completed; `resume` starts at round 1')
    return (f'rounds 1-{done} were released but could not all be checkpointed; `resume` '
            f'restarts after round {self.progress.checkpointed} and counts the rounds it '
            're-executes again')

  def _ending(self, **how) -> components.RunSummary:
    return components.RunSummary(rounds_completed=self.progress.round_num, **how)

  def _run_one_round(self, round_num: int) -> None:
    """Round `round_num`, from sampling to its released outputs; nothing of it if a stop signal
    abandoned it (the next check checkpoints and stops)."""
    c, config = self.c, self.config
    round_start = time.perf_counter()
    heap.release_free_memory()   # The last round's transient memory (counted in this round).
    row: dict[str, Any] = {'round': round_num}
    output = self._train(round_num, row)
    if output is None:
      return
    is_last = round_num == config.total_rounds
    c.privacy.record(round_num, output.metrics['aggregator'])
    _add_training_metrics(output.metrics, row)
    row.update(c.privacy.epsilon_columns(is_last))
    completed = round_hooks.Round(
        num=round_num, is_last=is_last, is_eval=round_num % config.rounds_per_eval == 0 or is_last,
        trained_state=output.state, state=output.state, row=row,
        weights_fn=lambda: evaluation.flat_model_weights(ca.model_weights(c.process, output.state)))
    self.progress.hooks_round = round_num   # Before any hook changes: see `Progress`.
    for hook in c.hooks:
      hook.after_round(completed)
    self._release(round_num, completed.state, row, round_start)
    if (config.worker_restart_rounds and round_num % config.worker_restart_rounds == 0
        and not is_last):
      runtime.restart_local_worker()   # Between rounds: no computation is running.

  def _train(self, round_num: int, row: dict[str, Any]):
    """Samples the round's clients and runs `process.next`; its output, or None if a stop
    signal abandoned the round. Raises RunFailedError (after checkpointing the last completed
    round) if the TFF runtime fails."""
    c, config = self.c, self.config
    sampled = c.sampler.sample(round_num)
    row['num_clients'] = len(sampled)
    client_ids, own_ids = _split_sample(c.hooks, sampled)
    t0 = time.perf_counter()
    datasets, rejected = self.client_data.get(client_ids) if client_ids else ([], {})
    for hook, own in zip(c.hooks, own_ids):
      datasets = hook.round_values(datasets, own)
    if rejected:
      row['clients_rejected'] = len(rejected)
      if not config.private_release:   # Names clients: a non-private diagnostic.
        for cid, reason in list(rejected.items())[:5]:
          c.log(f'round {round_num}: client {cid} skipped: {reason}')
    if round_num < config.total_rounds:
      self.client_data.prefetch(_split_sample(c.hooks, c.sampler.sample(round_num + 1))[0])
    # A round whose sample is empty (Poisson drew nobody, or every sampled client was
    # rejected) still runs: the sampled Gaussian mechanism releases a noised zero sum, the
    # model moves by noise alone, and the round is recorded like any other, so that neither
    # the outputs nor the ledger reveal that the sample was empty.
    try:
      state = self.progress.state
      for hook in c.hooks:
        state = hook.before_round(round_num, state)
      output = c.process.next(state, datasets)
    except Exception as e:  # pylint: disable=broad-except
      if self.stop.received is not None:   # E.g. the worker was killed too: round abandoned.
        return None
      # State and hooks are still those of the last completed round: checkpoint it.
      checkpointing.save_completed_rounds(c.run_dir, c.hooks, self.progress, c.log)
      first_line = (str(e).strip().splitlines() or [''])[0][:300]
      raise errors.RunFailedError(
          f'round {round_num} failed in the TFF runtime ({type(e).__name__}: {first_line}). '
          f'Nothing of round {round_num} was written; outputs are complete up to round '
          f'{self.progress.round_num}. Rerun with `resume`') from e
    row['round_seconds'] = time.perf_counter() - t0
    return output

  def _release(self, round_num: int, state, row: dict[str, Any], round_start: float) -> None:
    """Checkpoint (on checkpoint rounds), then the round's outputs: metrics row, TensorBoard,
    console. The round is then the last completed one."""
    c, config, progress = self.c, self.config, self.progress
    checkpoint_now = (round_num % config.rounds_per_checkpoint == 0
                      or round_num == config.total_rounds or self.stop.received is not None)
    with run_dir_lib.writing(f'the outputs of round {round_num}', c.run_dir.path):
      if checkpoint_now:
        # Before any output of the round is released (see resume.reconcile_ledger).
        checkpointing.save(c.run_dir, round_num, state, c.hooks)
        progress.checkpointed = round_num   # Now: a resume continues after this round.
      # Whole round: sampling, data, TFF round, ledger, accounting, hooks, checkpoint.
      row['wall_seconds'] = time.perf_counter() - round_start
      row = release.released_row(row, config.release_facts)
      c.run_dir.metrics.append(row)
      c.run_dir.write_summaries(round_num, row)
    progress.state = state   # Then round_num: an abort between the two writes nothing.
    progress.round_num = round_num
    c.log(report.console_line(row, config.total_rounds))


def _split_sample(hooks, sampled) -> tuple[list, list[list]]:
  """(the ids whose data the loop builds, each hook's own ids) of a sample."""
  client_ids, own_ids = list(sampled), []
  for hook in hooks:
    client_ids, own = hook.split_sample(client_ids)
    own_ids.append(own)
  return client_ids, own_ids


def _in_a_new_thread(fn):
  """fn()'s result (or its exception), computed in a thread of its own.

  An abort is raised wherever this thread was, which can be halfway through TensorFlow's
  bookkeeping of a function being traced (a client's `tf.data` map, say): this thread's graph
  stack is then left inside that function, where a checkpoint cannot be written
  (`tf.saved_model.save` refuses, and a variable's assign would only add a graph op). TensorFlow
  keeps that stack per thread, so a new thread starts eager.
  """
  with concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                             thread_name_prefix='tff_dp-abort') as pool:
    return pool.submit(fn).result()


def _add_training_metrics(metrics, row: dict[str, Any]) -> None:
  """The clients' training loss (and accuracy) and the aggregator's measurements, flattened."""
  train = metrics['client_work']['train']
  row['train_loss'] = float(train['loss'])
  if 'accuracy' in train:
    row['train_accuracy'] = float(train['accuracy'])
  _flatten('aggregator', metrics['aggregator'], row)


def _flatten(prefix: str, value, out: dict) -> None:
  """Numeric scalar leaves of a nested measurement as 'prefix/key/...' columns of `out`."""
  if isinstance(value, Mapping):
    for k, v in value.items():
      _flatten(f'{prefix}/{k}' if prefix else str(k), v, out)
  elif isinstance(value, (list, tuple)) and not hasattr(value, 'shape'):
    for i, v in enumerate(value):
      _flatten(f'{prefix}/{i}', v, out)
  else:
    arr = np.asarray(value)
    if arr.size == 1 and arr.dtype.kind in 'fiub':
      out[prefix] = arr.item()
