"""Resuming a run: restore the latest checkpoint, set aside what later rounds released, and
reconcile the ledger with what was released, so no round is under-counted.

A round's outputs (metrics row, console, TensorBoard) are released only after its ledger record
is durable and, on checkpoint rounds, after its checkpoint (see docs/ARCHITECTURE.md, "Execution
order of one round"); this module relies on that order.
"""

from typing import Any, Callable, Sequence

from tff_dp import ledger as ledger_lib
from tff_dp import run_format
from tff_dp.run_format import metrics_csv
from tff_dp.training.run_state import checkpointing
from tff_dp.training.run_state import round_hooks

SUPERSEDED_METRICS = run_format.SUPERSEDED_METRICS_FILE
UNRELEASED_LEDGER = run_format.UNRELEASED_LEDGER_FILE


def restore(run_dir, process, initial_state, hooks: Sequence[round_hooks.RoundHook],
            log: Callable[[str], None]) -> tuple[int, Any]:
  """(the round to continue after, its state): the latest checkpoint (round 0 and
  `initial_state` if none), with each hook restored from its entries; the metrics rows of
  later rounds, which are re-executed, are moved to metrics.superseded.csv."""
  state, round_num = initial_state, 0
  loaded = checkpointing.load_latest(run_dir, initial_state, hooks)
  if loaded is not None:
    state, round_num = loaded['state'], int(loaded['round_num'])
    for hook in hooks:
      state = hook.restored_state(state, initial_state)
  for hook in hooks:
    hook.restore(loaded, process, state)
  # Rows of rounds after the checkpoint (or of every round, if none was saved yet) are kept
  # aside: those rounds are re-executed.
  moved = run_dir.metrics.move_rows_after(round_num, run_dir.file(SUPERSEDED_METRICS))
  log(f'resuming at round {round_num + 1}'
      + (f' ({moved} later metric rows moved to {SUPERSEDED_METRICS})' if moved else ''))
  return round_num, state


def reconcile_ledger(ledger: ledger_lib.PrivacyLedger, run_dir, checkpoint_round: int,
                     log: Callable[[str], None]
                     ) -> tuple[ledger_lib.PrivacyLedger, list[ledger_lib.RoundRecord]]:
  """(the ledger to append to, its records that stay counted) when resuming from the checkpoint
  of `checkpoint_round`.

  A record past the checkpoint whose metrics row was never written belongs to a round that
  released nothing: it is moved to ledger.unreleased.jsonl (kept for audit) and the round is
  re-executed and recorded once. A record past the checkpoint whose metrics WERE released
  (possible when rounds_per_checkpoint > 1) stays counted, and its re-execution is counted
  again: accounting is conservative, never optimistic. `ledger` is closed and reopened when
  records were moved.
  """
  records = ledger_lib.read_ledger(ledger.path, ledger.mac_key, ledger.seal_path)
  released_rounds = {int(r['round']) for r in run_dir.metrics.read_rows()}
  superseded = metrics_csv.MetricsCsv(run_dir.file(SUPERSEDED_METRICS))
  released_rounds |= {int(r['round']) for r in superseded.read_rows()}
  unreleased = [r for r in records
                if r.round_num > checkpoint_round and r.round_num not in released_rounds]
  if unreleased:
    ledger.close()
    ledger_lib.move_records(ledger.path, unreleased, run_dir.file(UNRELEASED_LEDGER),
                            ledger.mac_key, ledger.seal_path)
    ledger = ledger_lib.PrivacyLedger(ledger.path, mac_key=ledger.mac_key,
                                      seal_path=ledger.seal_path)
    log(f'ledger: {len(unreleased)} record(s) of rounds that released no output moved to '
        f'{UNRELEASED_LEDGER}; those rounds are re-executed')
    records = ledger_lib.read_ledger(ledger.path, ledger.mac_key, ledger.seal_path)
  again = sorted({r.round_num for r in records if r.round_num > checkpoint_round})
  if again:
    log(f'ledger: rounds {again[0]}-{again[-1]} released metrics after the last checkpoint '
        f'(round {checkpoint_round}); they stay counted, and re-executing them charges '
        f'{len(again)} round(s) again (conservative; with a sampling seed, as the same sample '
        'released twice)')
  return ledger, records

