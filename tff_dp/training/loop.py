"""The round loop: sample, run a FedAvg round, ledger, epsilon, metrics, checkpoints, resume.

Order inside a round (see docs/ARCHITECTURE.md): the ledger record is made durable before any
output of the round (metrics, console, checkpoint) is released, so the ledger never under-counts.
"""

import collections
import contextlib
import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_dp import errors
from tff_dp import ledger as ledger_lib
from tff_dp import runtime
from tff_dp.aggregators import privacy_queries as privacy_queries_lib
from tff_dp.training import client_data as client_data_lib
from tff_dp.training import evaluation
from tff_dp.training import metrics_file
from tff_dp.training import plots
from tff_dp.training import privacy_statement
from tff_dp.training import run_dir as run_dir_lib
from tff_dp.training import stop_signal


@dataclasses.dataclass
class LoopConfig:
  total_rounds: int
  rounds_per_eval: int = 1
  rounds_per_checkpoint: int = 1
  delta: float = 1e-5
  max_epsilon: Optional[float] = None
  uncertainty_last_k: int = 0
  dp: str = 'adaptive'              # The DP aggregation kind; 'none' for no DP.
  private_release: bool = False     # Keep non-private diagnostics out of every output.
  client_cache_size: int = 1000     # Preprocessed client datasets kept (0: rebuild each round).
  prefetch_clients: bool = True     # Build round r+1's client datasets while round r runs.
  # Replace the local TFF worker by a fresh process after every N-th round (0: never).
  worker_restart_rounds: int = 0


@dataclasses.dataclass
class LoopComponents:
  """Everything the loop drives; built by `tff_dp.training.experiment` (or by a user)."""
  process: Any                                   # tff.learning.templates.LearningProcess
  run_dir: Any                                   # run_dir.RunDirectory (created)
  sampler: Any                                   # tff_dp.sampling sampler
  client_dataset_fn: Callable[[Any], Any]        # client id -> preprocessed tf.data.Dataset
  evaluator: Optional[evaluation.CentralizedEvaluator]
  ledger: Optional[ledger_lib.PrivacyLedger]
  accountant: Any                                # tff_dp.accounting.LedgerAccountant or None
  aggregates: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  train_on_aggregate: Any = None                 # checkpoint_aggregation.TrainOnAggregate or None
  # The queries round 1 will execute (for max_epsilon before any record exists).
  planned_queries: Sequence[ledger_lib.GaussianSumQuery] = ()
  planned_tree_leaf: Optional[int] = None        # 1 for tree aggregation (DP-FTRL)
  log: Callable[[str], None] = print
  # dataset -> reason it cannot be trained on, or None (see client_data.check_client_dataset).
  check_client_fn: Optional[Callable[[Any], Optional[str]]] = None
  # Per-group clip factories: 'group_g' -> the names of its weights (labels in the clip plot).
  clip_group_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # (client id, checked dataset) -> what `process.next` receives for an accepted client; None:
  # the dataset. The id when `process` builds the datasets on the workers.
  client_value_fn: Optional[Callable[[Any, Any], Any]] = None


def _flatten(prefix: str, value, out: dict) -> None:
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


def _program_state(state, round_num, aggregates, recent):
  return collections.OrderedDict(
      state=state,
      round_num=np.int64(round_num),
      aggregates=collections.OrderedDict(
          (name, agg.get_state()) for name, agg in aggregates.items()),
      recent=list(recent),
  )


def _predicted_epsilon(c: LoopComponents, round_num: int, last_record) -> Optional[float]:
  """Epsilon after `round_num` if its mechanism matches the last executed (or planned) one."""
  if c.accountant is None:
    return None
  queries = last_record.queries if last_record is not None else tuple(c.planned_queries)
  if not queries:
    return None
  sampling_event = c.sampler.sampling_event(round_num)
  leaf = None
  if last_record is not None and last_record.tree_leaf is not None:
    # The tree goes on within an epoch (at least as costly as a restart) and restarts at an
    # epoch boundary (the tree factories do).
    same_epoch = sampling_event.epoch == last_record.sampling.epoch
    leaf = last_record.tree_leaf + 1 if same_epoch else 1
  elif last_record is None:
    leaf = c.planned_tree_leaf
  record = ledger_lib.RoundRecord(round_num, sampling_event, tuple(queries), leaf)
  return c.accountant.peek_epsilon(record)


def _reconcile_ledger(c: LoopComponents, checkpoint_round: int):
  """Ledger records to keep when resuming from the checkpoint of `checkpoint_round`.

  A round's outputs (metrics row, console, TensorBoard) are released only after its ledger
  record is durable and, on checkpoint rounds, after its checkpoint. A record past the
  checkpoint whose metrics row was never written therefore belongs to a round that released
  nothing: it is moved to ledger.unreleased.jsonl (kept for audit) and the round is re-executed
  and recorded once. A record past the checkpoint whose metrics WERE released (possible when
  rounds_per_checkpoint > 1) stays counted, and its re-execution is counted again: accounting
  is conservative, never optimistic.
  """
  records = ledger_lib.read_ledger(c.ledger.path)
  released_rounds = {int(r['round']) for r in c.run_dir.metrics.read_rows()}
  superseded = run_dir_lib.MetricsCsv(c.run_dir.file('metrics.superseded.csv'))
  released_rounds |= {int(r['round']) for r in superseded.read_rows()}
  unreleased = [r for r in records
                if r.round_num > checkpoint_round and r.round_num not in released_rounds]
  if unreleased:
    c.ledger.close()
    ledger_lib.move_records(c.ledger.path, unreleased, c.run_dir.file('ledger.unreleased.jsonl'))
    c.ledger = ledger_lib.PrivacyLedger(c.ledger.path)
    c.log(f'ledger: {len(unreleased)} record(s) of rounds that released no output moved to '
          'ledger.unreleased.jsonl; those rounds are re-executed')
    records = ledger_lib.read_ledger(c.ledger.path)
  if any(r.round_num > checkpoint_round for r in records):
    c.log('ledger: rounds after the checkpoint released metrics before the crash; they stay '
          'counted and their re-execution is counted again (conservative)')
  return records


def run_training(config: LoopConfig, c: LoopComponents,
                 stop: Optional[stop_signal.StopSignal] = None) -> dict[str, Any]:
  """Runs (or resumes) training; returns a summary dict of the final round.

  `stop`: an installed StopSignal (None: one is installed for the duration of training).
  """
  process = c.process
  state = process.initialize()
  start_round = 1
  recent: collections.deque = collections.deque(maxlen=max(config.uncertainty_last_k, 1))
  last_record = None

  if c.run_dir.resume:
    structure = _program_state(state, 0, c.aggregates, [])
    loaded, _ = c.run_dir.load_latest_checkpoint(structure)
    if loaded is not None:
      state = loaded['state']
      for name, agg in c.aggregates.items():
        agg.set_state(loaded['aggregates'][name])
      recent.extend(list(loaded['recent']))
      start_round = int(loaded['round_num']) + 1
    # Rows of rounds after the checkpoint (or of every round, if none was saved yet) are kept
    # aside: those rounds are re-executed.
    moved = c.run_dir.metrics.move_rows_after(
        start_round - 1, c.run_dir.file('metrics.superseded.csv'))
    c.log(f'resuming at round {start_round}'
          + (f' ({moved} later metric rows moved to metrics.superseded.csv)' if moved else ''))
    if c.ledger is not None:
      records = _reconcile_ledger(c, start_round - 1)
      for record in records:
        c.accountant.add(record)
      last_record = records[-1] if records else None

  summary: dict[str, Any] = {'stopped_by_max_epsilon': False, 'stopped_by_signal': None,
                             'rounds_completed': start_round - 1}
  client_data = client_data_lib.ClientDatasets(
      c.client_dataset_fn, config.client_cache_size, config.prefetch_clients,
      check_fn=c.check_client_fn, value_fn=c.client_value_fn)
  progress = _Progress(round_num=start_round - 1, state=state, recent=recent,
                       checkpointed=start_round - 1)
  with contextlib.ExitStack() as stack:
    if stop is None:
      stop = stack.enter_context(stop_signal.StopSignal(c.log))
    try:
      _run_rounds(config, c, client_data, progress, last_record, summary, stop)
    finally:
      client_data.close()
  round_num, state = progress.round_num, progress.state
  summary['rounds_completed'] = round_num
  summary['final_state'] = state
  if summary['stopped_by_signal']:
    return summary   # Not finished: no final report, no summary.json; --resume continues.
  with _writing('the final report', c.run_dir.path):
    if config.uncertainty_last_k and c.evaluator is not None and len(recent) >= 2:
      summary['uncertainty'] = _write_uncertainty(c, list(recent))
    plots.write_run_plots(c.run_dir.file('metrics.csv'), c.run_dir.file('plots'),
                          delta=config.delta, clip_group_labels=c.clip_group_labels)
    summary['privacy'] = _privacy_statement(config, c, round_num)
    # Marks a run that ended normally (tools such as reproduce.py skip finished runs).
    c.run_dir.write_json('summary.json', {
        'rounds_completed': round_num, 'total_rounds': config.total_rounds,
        'stopped_by_max_epsilon': summary['stopped_by_max_epsilon'],
        'privacy': summary['privacy']})
  c.log(privacy_statement.format_statement(summary['privacy']))
  return summary


def _privacy_statement(config: LoopConfig, c: LoopComponents, rounds: int) -> dict[str, Any]:
  epsilons = {}
  if c.accountant is not None:
    epsilons = {m: c.accountant.epsilon_rdp() if m == 'rdp' else c.accountant.epsilon_pld()
                for m in c.accountant.methods}
  rows = c.run_dir.metrics.read_rows()
  return privacy_statement.statement(
      dp=config.dp, rounds_completed=rounds, epsilons=epsilons, delta=config.delta,
      sampling_event=c.sampler.sampling_event(max(rounds, 1)),
      sampling_secret=c.sampler.secret, private_release=config.private_release,
      released_columns=rows[0].keys() if rows else (),
      **({'neighboring_relation': c.accountant.neighboring_relation}
         if c.accountant is not None else {}))


@dataclasses.dataclass
class _Progress:
  """The last completed round and what a checkpoint of it needs."""
  round_num: int
  state: Any
  recent: Any
  checkpointed: int


@contextlib.contextmanager
def _writing(what: str, where: str):
  """Turns a failed write (disk full, permissions) into a RunFailedError naming it."""
  try:
    yield
  except (OSError, tf.errors.OpError) as e:
    reason = getattr(e, 'strerror', None) or getattr(e, 'message', None) or str(e)
    reason = ' '.join(str(reason).split())
    if len(reason) > 300:   # TF puts the cause (e.g. "No space left on device") at the end.
      reason = reason[:80] + ' ... ' + reason[-200:]
    raise errors.RunFailedError(
        f'could not write {what} in {where}: {reason}. Files '
        'written before are intact; fix the cause (free disk space, permissions) and rerun '
        'with `resume`') from e


def _checkpoint_completed_rounds(c: LoopComponents, progress: _Progress) -> None:
  """Checkpoints the last completed round if it was not (so --resume re-executes nothing)."""
  if progress.round_num > progress.checkpointed:
    try:
      c.run_dir.save_checkpoint(
          _program_state(progress.state, progress.round_num, c.aggregates, progress.recent),
          progress.round_num)
      progress.checkpointed = progress.round_num
    except (OSError, tf.errors.OpError) as e:
      c.log(f'could not checkpoint round {progress.round_num} ({e}); `resume` restarts from '
            f'round {progress.checkpointed + 1}')


def _run_rounds(config: LoopConfig, c: LoopComponents, client_data, progress: _Progress,
                last_record, summary, stop) -> None:
  """Rounds progress.round_num+1..total_rounds; `progress` tracks the last completed one."""
  process = c.process
  state, recent = progress.state, progress.recent
  for round_num in range(progress.round_num + 1, config.total_rounds + 1):
    if stop.received is not None:
      _checkpoint_completed_rounds(c, progress)
      summary['stopped_by_signal'] = stop.name
      c.log(f'stopped by {stop.name} after round {progress.round_num}; checkpoint and ledger '
            'are consistent, continue with `resume`')
      return
    if config.max_epsilon is not None:
      predicted = _predicted_epsilon(c, round_num, last_record)
      if predicted is not None and predicted > config.max_epsilon:
        c.log(f'stopping before round {round_num}: epsilon would reach {predicted:.4g} > '
              f'`max_epsilon={config.max_epsilon:g}`')
        summary['stopped_by_max_epsilon'] = True
        return

    round_start = time.perf_counter()
    client_ids = c.sampler.sample(round_num)
    row: dict[str, Any] = {'round': round_num, 'num_clients': len(client_ids)}
    t0 = time.perf_counter()
    datasets, rejected = client_data.get(client_ids) if client_ids else ([], {})
    if rejected:
      row['clients_rejected'] = len(rejected)
      if not config.private_release:   # Names clients: a non-private diagnostic.
        for cid, reason in list(rejected.items())[:5]:
          c.log(f'round {round_num}: client {cid} skipped: {reason}')
    if round_num < config.total_rounds:
      client_data.prefetch(c.sampler.sample(round_num + 1))
    # A round whose sample is empty (Poisson drew nobody, or every sampled client was
    # rejected) still runs: the sampled Gaussian mechanism releases a noised zero sum, the
    # model moves by noise alone, and the round is recorded like any other, so that neither
    # the outputs nor the ledger reveal that the sample was empty.
    try:
      output = process.next(state, datasets)
    except Exception as e:  # pylint: disable=broad-except
      if stop.received is not None:   # Ctrl-C also reached the worker: round abandoned.
        continue   # The check at the top of the loop checkpoints and stops.
      # State and aggregates are still those of the last completed round: checkpoint it.
      _checkpoint_completed_rounds(c, progress)
      first_line = (str(e).strip().splitlines() or [''])[0][:300]
      raise errors.RunFailedError(
          f'round {round_num} failed in the TFF runtime ({type(e).__name__}: {first_line}). '
          f'Nothing of round {round_num} was written; outputs are complete up to round '
          f'{progress.round_num}. Rerun with `resume`') from e
    row['round_seconds'] = time.perf_counter() - t0
    state = output.state
    metrics = output.metrics
    if config.dp != 'none':
      queries = privacy_queries_lib.find_privacy_queries(metrics['aggregator'])
      if not queries:
        raise RuntimeError('DP is on but the aggregator reported no privacy_queries; refusing '
                           'to train without a ledger record')
      last_record = ledger_lib.RoundRecord(
          round_num, c.sampler.sampling_event(round_num), tuple(queries),
          privacy_queries_lib.find_tree_leaf(metrics['aggregator']))
      with _writing(f'the ledger record of round {round_num}', c.ledger.path):
        c.ledger.append(last_record)   # Durable before any output of the round is released.
      c.accountant.add(last_record)
    train = metrics['client_work']['train']
    row['train_loss'] = float(train['loss'])
    if 'accuracy' in train:
      row['train_accuracy'] = float(train['accuracy'])
    _flatten('aggregator', metrics['aggregator'], row)

    if c.accountant is not None:
      epsilons = c.accountant.epsilon()
      if epsilons.get('pld', 0.0) is None and round_num == config.total_rounds:
        epsilons['pld'] = c.accountant.epsilon_pld()  # The final value is always reported.
      for method, eps in epsilons.items():
        row[f'epsilon_{method}'] = eps

    is_last = round_num == config.total_rounds
    is_eval_round = c.evaluator is not None and (
        round_num % config.rounds_per_eval == 0 or is_last)
    # Reading the model out of the TFF state is a computation call: only when something uses it.
    needs_weights = (is_eval_round or c.aggregates or config.uncertainty_last_k
                     or c.train_on_aggregate is not None)
    weights = (evaluation.flat_model_weights(process.get_model_weights(state))
               if needs_weights else None)
    for agg in c.aggregates.values():
      agg.update(weights)
    if config.uncertainty_last_k:
      recent.append(weights)
    if c.train_on_aggregate is not None:
      start_weights = c.train_on_aggregate.select(round_num, weights, c.aggregates)
      if start_weights is not weights:
        state = c.train_on_aggregate.apply(process, state, start_weights)
        row['trained_from_aggregate'] = 1

    if is_eval_round:
      for name, value in c.evaluator.evaluate(weights).items():
        row[f'eval_{name}'] = value
      for agg_name, agg in c.aggregates.items():
        agg_weights = agg.value()
        if agg_weights is not None:
          for name, value in c.evaluator.evaluate(agg_weights).items():
            row[f'eval_{agg_name}_{name}'] = value

    checkpoint_now = (round_num % config.rounds_per_checkpoint == 0 or is_last
                      or stop.received is not None)
    with _writing(f'the outputs of round {round_num}', c.run_dir.path):
      if checkpoint_now:
        # Before any output of the round is released (see _reconcile_ledger).
        c.run_dir.save_checkpoint(_program_state(state, round_num, c.aggregates, recent),
                                  round_num)
      # Whole round: sampling, data, TFF round, ledger, accounting, eval, checkpoint.
      row['wall_seconds'] = time.perf_counter() - round_start
      row = privacy_statement.released_row(row, config.private_release)
      c.run_dir.metrics.append(row)
      c.run_dir.write_summaries(round_num, row)
    progress.round_num, progress.state = round_num, state
    if checkpoint_now:
      progress.checkpointed = round_num
    c.log(_console_line(row, config.total_rounds))
    if (config.worker_restart_rounds and round_num % config.worker_restart_rounds == 0
        and round_num < config.total_rounds):
      runtime.restart_local_worker()   # Between rounds: no computation is running.
  if stop.received is not None and progress.round_num < config.total_rounds:
    _checkpoint_completed_rounds(c, progress)   # The last round was abandoned by the signal.
    summary['stopped_by_signal'] = stop.name


def _write_uncertainty(c: LoopComponents, recent):
  from tff_dp import checkpoint_aggregation  # pylint: disable=g-import-not-at-top
  accuracies = np.array([c.evaluator.evaluate(w).get('accuracy', math.nan) for w in recent])
  scores = np.stack([c.evaluator.predict_scores(w) for w in recent])
  return checkpoint_aggregation.write_uncertainty_report(
      c.run_dir.file('uncertainty.json'), accuracy=accuracies, prediction_scores=scores)


def _console_line(row: Mapping[str, Any], total_rounds: int) -> str:
  parts = [f'round {row["round"]:>4d}/{total_rounds}']
  if 'num_clients' in row:
    parts.append(f'clients {row["num_clients"]:>3d}')
  if 'train_loss' in row:
    parts.append(f'loss {row["train_loss"]:.4f}')
  if 'train_accuracy' in row:
    parts.append(f'acc {row["train_accuracy"]:.4f}')
  clips = [v for k, v in row.items() if metrics_file.is_clip_column(k)]
  if len(clips) == 1:
    parts.append(f'clip {clips[0]:.4g}')
  elif clips:
    parts.append(f'clips {min(clips):.3g}..{max(clips):.3g}')
  for method in ('rdp', 'pld'):
    if row.get(f'epsilon_{method}') is not None:
      parts.append(f'eps_{method} {row[f"epsilon_{method}"]:.4g}')
  if 'eval_accuracy' in row:
    parts.append(f'eval_acc {row["eval_accuracy"]:.4f}')
  if 'round_seconds' in row:
    parts.append(f'{row["round_seconds"]:.2f}s')
  return '  '.join(parts)
