"""The round loop: sample, run a FedAvg round, ledger, epsilon, metrics, checkpoints.

Order inside a round (see docs/ARCHITECTURE.md): the ledger record is made durable before any
output of the round (metrics, console, checkpoint) is released, so the ledger never under-counts.
Resuming is `resume.py`, the checkpoint layout `checkpointing.py`, the console line and the
final report `report.py`.
"""

import collections
import contextlib
import dataclasses
import time
from typing import Any, Mapping, Optional

import numpy as np

from tff_dp import checkpoint_aggregation as ca
from tff_dp import errors
from tff_dp import ledger as ledger_lib
from tff_dp import runtime
from tff_dp.aggregators import privacy_queries as privacy_queries_lib
from tff_dp.training import checkpointing
from tff_dp.training import client_data as client_data_lib
from tff_dp.training import components
from tff_dp.training import evaluation
from tff_dp.training import release
from tff_dp.training import report
from tff_dp.training import resume
from tff_dp.training import run_dir as run_dir_lib
from tff_dp.training import stop_signal


def run_training(config: components.LoopConfig, c: components.LoopComponents,
                 stop: Optional[stop_signal.StopSignal] = None) -> components.RunSummary:
  """Runs (or resumes) training; returns how it ended, with the final report of a finished run.

  `stop`: an installed StopSignal (None: one is installed for the duration of training).
  """
  progress, last_record = _start(config, c)
  client_data = client_data_lib.ClientDatasets(
      c.client_dataset_fn, config.client_cache_size, config.prefetch_clients,
      check_fn=c.check_client_fn, value_fn=c.client_value_fn)
  with contextlib.ExitStack() as stack:
    if stop is None:
      stop = stack.enter_context(stop_signal.StopSignal(c.log))
    stop.rounds_started = True
    try:
      ending = _Rounds(config, c, client_data, stop, progress, last_record).run()
    finally:
      client_data.close()
  summary = dataclasses.replace(ending, rounds_completed=progress.round_num,
                                final_state=progress.state)
  if summary.stopped_by_signal:
    return summary   # Not finished: no final report, no summary.json; `resume` continues.
  return report.write_final_report(config, c, summary, progress.recent)


def _start(config: components.LoopConfig, c: components.LoopComponents
           ) -> tuple[checkpointing.Progress, Optional[ledger_lib.RoundRecord]]:
  """(the last completed round, the last ledger record): round 0 and none for a new run; for a
  resumed run, its checkpoint, with the ledger reconciled and replayed into the accountant."""
  recent: collections.deque = collections.deque(maxlen=max(config.uncertainty_last_k, 1))
  state = c.process.initialize()
  tracker = None
  if c.canaries is not None:
    c.canaries.start(_trainable(c.process, state))
    tracker = c.canaries.tracker
  if not c.run_dir.resume:
    return checkpointing.Progress(round_num=0, state=state, recent=recent, checkpointed=0,
                                  canary_tracker=tracker), None
  point = resume.restore(c.run_dir, state, c.aggregates, recent, c.log, tracker)
  if c.canaries is not None:
    c.canaries.continue_from(_trainable(c.process, point.state))
  last_record = None
  if c.ledger is not None:
    c.ledger, records = resume.reconcile_ledger(c.ledger, c.run_dir, point.round_num, c.log)
    for record in records:
      c.accountant.add(record)
    last_record = records[-1] if records else None
  progress = checkpointing.Progress(round_num=point.round_num, state=point.state,
                                    recent=point.recent, checkpointed=point.round_num,
                                    canary_tracker=tracker)
  return progress, last_record


def _trainable(process, state) -> list[np.ndarray]:
  """The trainable weights of the model in `state`, as numpy arrays."""
  return [np.asarray(w) for w in ca.model_weights(process, state).trainable]


class _Rounds:
  """Runs rounds progress.round_num+1..total_rounds; `progress` tracks the last completed one."""

  def __init__(self, config: components.LoopConfig, c: components.LoopComponents,
               client_data: client_data_lib.ClientDatasets, stop: stop_signal.StopSignal,
               progress: checkpointing.Progress,
               last_record: Optional[ledger_lib.RoundRecord]):
    self.config, self.c, self.client_data, self.stop = config, c, client_data, stop
    self.progress = progress
    self.last_record = last_record   # Of the last executed round: what max_epsilon predicts.

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
          f'{self._kept_rounds()}') from e

  def _run_rounds(self) -> components.RunSummary:
    config, progress = self.config, self.progress
    for round_num in range(progress.round_num + 1, config.total_rounds + 1):
      if self.stop.received is not None:
        self.c.log(f'stopped by {self.stop.name}: {self._kept_rounds()}')
        return self._ending(stopped_by_signal=self.stop.name)
      if config.max_epsilon is not None:
        predicted = self._predicted_epsilon(round_num)
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
    done = self.progress.round_num
    if self._checkpoint_completed_rounds():
      return (f'rounds 1-{done} are kept (checkpoint, ledger and metrics agree); `resume` '
              f'continues at round {done + 1}' if done else
              'no round had completed; `resume` starts at round 1')
    return (f'rounds 1-{done} were released but could not all be checkpointed; `resume` '
            f'restarts after round {self.progress.checkpointed} and counts the rounds it '
            're-executes again')

  def _ending(self, **how) -> components.RunSummary:
    return components.RunSummary(rounds_completed=self.progress.round_num, **how)

  def _checkpoint_completed_rounds(self) -> bool:
    return checkpointing.save_completed_rounds(self.c.run_dir, self.c.aggregates,
                                               self.progress, self.c.log)

  def _predicted_epsilon(self, round_num: int) -> Optional[float]:
    """Epsilon after `round_num` if its mechanism matches the last executed (or planned) one:
    the planned tuples of round 1 are exact; later, the last round's tuples with less noise
    (`next_round_bound`), since the next clip's float32 tuple can differ in its last bits."""
    c = self.c
    if c.accountant is None:
      return None
    queries = (next_round_bound(self.last_record.queries) if self.last_record is not None
               else tuple(c.planned_queries))
    if not queries:
      return None
    sampling_event = c.sampler.sampling_event(round_num)
    leaf = None
    last = self.last_record
    if last is not None and last.tree_leaf is not None:
      # The tree goes on within an epoch (at least as costly as a restart) and restarts at an
      # epoch boundary (the tree factories do).
      leaf = last.tree_leaf + 1 if sampling_event.epoch == last.sampling.epoch else 1
    elif last is None:
      leaf = c.planned_tree_leaf
    record = ledger_lib.RoundRecord(round_num, sampling_event, tuple(queries), leaf)
    return c.accountant.peek_epsilon(record)

  def _run_one_round(self, round_num: int) -> None:
    """Round `round_num`, from sampling to its released outputs; nothing of it if a stop signal
    abandoned it (the next check checkpoints and stops)."""
    config = self.config
    round_start = time.perf_counter()
    row: dict[str, Any] = {'round': round_num}
    output = self._train(round_num, row)
    if output is None:
      return
    self._record_privacy(round_num, output.metrics)
    _add_training_metrics(output.metrics, row)
    self._add_epsilons(round_num, row)
    is_last = round_num == config.total_rounds
    is_eval_round = self.c.evaluator is not None and (
        round_num % config.rounds_per_eval == 0 or is_last)
    state, weights = self._update_aggregates(round_num, output.state, is_eval_round, row)
    if self.c.canaries is not None:
      self._observe_canaries(round_num, output.state, state, row)
    if is_eval_round:
      self._evaluate(weights, row)
    self._release(round_num, state, row, round_start)
    if (config.worker_restart_rounds and round_num % config.worker_restart_rounds == 0
        and round_num < config.total_rounds):
      runtime.restart_local_worker()   # Between rounds: no computation is running.

  def _observe_canaries(self, round_num: int, round_state, next_state,
                        row: dict[str, Any]) -> None:
    """Adds the round's model change to the canary statistics; on evaluation rounds and the
    last round, the two estimates at the run's delta (`canary_run`'s columns)."""
    config, canaries = self.config, self.c.canaries
    t0 = time.perf_counter()
    end = _trainable(self.c.process, round_state)
    canaries.observe_round(end)
    if next_state is not round_state:   # Restarted from a checkpoint aggregate.
      canaries.continue_from(_trainable(self.c.process, next_state))
    if round_num % config.rounds_per_eval == 0 or round_num == config.total_rounds:
      row.update(canaries.estimates(end, config.delta))
    row['canary_seconds'] = time.perf_counter() - t0   # The bookkeeping's cost (a timing).

  def _train(self, round_num: int, row: dict[str, Any]):
    """Samples the round's clients and runs `process.next`; its output, or None if a stop
    signal abandoned the round. Raises RunFailedError (after checkpointing the last completed
    round) if the TFF runtime fails."""
    c, config = self.c, self.config
    client_ids = c.sampler.sample(round_num)
    row['num_clients'] = len(client_ids)
    canary_ids = []
    if c.canaries is not None:
      client_ids, canary_ids = c.canaries.split(client_ids)
    t0 = time.perf_counter()
    datasets, rejected = self.client_data.get(client_ids) if client_ids else ([], {})
    if c.canaries is not None:
      datasets = c.canaries.round_values(datasets, canary_ids)
    if rejected:
      row['clients_rejected'] = len(rejected)
      if not config.private_release:   # Names clients: a non-private diagnostic.
        for cid, reason in list(rejected.items())[:5]:
          c.log(f'round {round_num}: client {cid} skipped: {reason}')
    if round_num < config.total_rounds:
      upcoming = c.sampler.sample(round_num + 1)
      self.client_data.prefetch(upcoming if c.canaries is None else c.canaries.split(upcoming)[0])
    # A round whose sample is empty (Poisson drew nobody, or every sampled client was
    # rejected) still runs: the sampled Gaussian mechanism releases a noised zero sum, the
    # model moves by noise alone, and the round is recorded like any other, so that neither
    # the outputs nor the ledger reveal that the sample was empty.
    try:
      output = c.process.next(self.progress.state, datasets)
    except Exception as e:  # pylint: disable=broad-except
      if self.stop.received is not None:   # Ctrl-C also reached the worker: round abandoned.
        return None
      # State and aggregates are still those of the last completed round: checkpoint it.
      self._checkpoint_completed_rounds()
      first_line = (str(e).strip().splitlines() or [''])[0][:300]
      raise errors.RunFailedError(
          f'round {round_num} failed in the TFF runtime ({type(e).__name__}: {first_line}). '
          f'Nothing of round {round_num} was written; outputs are complete up to round '
          f'{self.progress.round_num}. Rerun with `resume`') from e
    row['round_seconds'] = time.perf_counter() - t0
    return output

  def _record_privacy(self, round_num: int, metrics) -> None:
    """Appends the round's ledger record (durable before any output of the round is released)
    and adds it to the accountant; nothing without DP."""
    c = self.c
    if self.config.dp == 'none':
      return
    queries = privacy_queries_lib.find_privacy_queries(metrics['aggregator'])
    if not queries:
      raise RuntimeError('DP is on but the aggregator reported no privacy_queries; refusing '
                         'to train without a ledger record')
    self.last_record = ledger_lib.RoundRecord(
        round_num, c.sampler.sampling_event(round_num), tuple(queries),
        privacy_queries_lib.find_tree_leaf(metrics['aggregator']))
    with run_dir_lib.writing(f'the ledger record of round {round_num}', c.ledger.path):
      c.ledger.append(self.last_record)
    c.accountant.add(self.last_record)

  def _add_epsilons(self, round_num: int, row: dict[str, Any]) -> None:
    accountant = self.c.accountant
    if accountant is None:
      return
    epsilons = accountant.epsilon()
    if epsilons.get('pld', 0.0) is None and round_num == self.config.total_rounds:
      epsilons['pld'] = accountant.epsilon_pld()  # The final value is always reported.
    for method, eps in epsilons.items():
      row[f'epsilon_{method}'] = eps

  def _update_aggregates(self, round_num: int, state, is_eval_round: bool,
                         row: dict[str, Any]):
    """(state, model weights): checkpoint aggregates and the last-k weights updated with this
    round's model, and the state restarted from an aggregate when the policy says so. The
    weights are read out of the state only when something uses them."""
    c = self.c
    needs_weights = (is_eval_round or c.aggregates or self.config.uncertainty_last_k
                     or c.train_on_aggregate is not None)
    weights = (evaluation.flat_model_weights(ca.model_weights(c.process, state))
               if needs_weights else None)
    for agg in c.aggregates.values():
      agg.update(weights)
    if self.config.uncertainty_last_k:
      self.progress.recent.append(weights)
    if c.train_on_aggregate is not None:
      start_weights = c.train_on_aggregate.select(round_num, weights, c.aggregates)
      if start_weights is not weights:
        state = c.train_on_aggregate.apply(c.process, state, start_weights)
        row['trained_from_aggregate'] = 1
    return state, weights

  def _evaluate(self, weights, row: dict[str, Any]) -> None:
    """Central evaluation of the round's model and of each checkpoint aggregate."""
    evaluator = self.c.evaluator
    for name, value in evaluator.evaluate(weights).items():
      row[f'eval_{name}'] = value
    for agg_name, agg in self.c.aggregates.items():
      agg_weights = agg.value()
      if agg_weights is not None:
        for name, value in evaluator.evaluate(agg_weights).items():
          row[f'eval_{agg_name}_{name}'] = value

  def _release(self, round_num: int, state, row: dict[str, Any], round_start: float) -> None:
    """Checkpoint (on checkpoint rounds), then the round's outputs: metrics row, TensorBoard,
    console. The round is then the last completed one."""
    c, config, progress = self.c, self.config, self.progress
    checkpoint_now = (round_num % config.rounds_per_checkpoint == 0
                      or round_num == config.total_rounds or self.stop.received is not None)
    with run_dir_lib.writing(f'the outputs of round {round_num}', c.run_dir.path):
      if checkpoint_now:
        # Before any output of the round is released (see resume.reconcile_ledger).
        checkpointing.save(c.run_dir, round_num, state, c.aggregates, progress.recent,
                           progress.canary_tracker)
      # Whole round: sampling, data, TFF round, ledger, accounting, eval, checkpoint.
      row['wall_seconds'] = time.perf_counter() - round_start
      row = release.released_row(row, config.release_facts)
      c.run_dir.metrics.append(row)
      c.run_dir.write_summaries(round_num, row)
    progress.round_num, progress.state = round_num, state
    if checkpoint_now:
      progress.checkpointed = round_num
    c.log(report.console_line(row, config.total_rounds))


# How much less noise, relative, the prediction of the next round assumes: float32 computes each
# round's noise stddev as z * clip from the round's clip, so the next round's stddev / clip
# differs from the last round's by at most two float32 roundings (2 * 2^-24 ~ 1.2e-7); 1e-6
# covers that with margin, and less noise can only raise epsilon.
PREDICTION_MARGIN = 1e-6


def next_round_bound(queries) -> tuple:
  """`queries` with each noise stddev lowered by PREDICTION_MARGIN: a `max_epsilon` prediction
  of the next round that holds whatever last bits its float32 tuples get."""
  return tuple(ledger_lib.GaussianSumQuery(q.name, q.l2_norm_clip,
                                           q.noise_stddev * (1.0 - PREDICTION_MARGIN))
               for q in queries)


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
