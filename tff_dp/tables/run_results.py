"""Reads a finished run directory into the numbers a paper table compares.

Reads only what the run wrote (config.json, metrics.csv, ledger.jsonl), so tables can be built
on another machine from copied run directories. Epsilon is recomputed from the ledger at the
table's delta (the paper's, when the run names one), never taken from the metrics CSV: the
ledger is the privacy record of truth (McMahan & Andrew), and papers differ in delta.
"""

import dataclasses
import json
import math
import os
from typing import Optional

from tff_dp import ledger as ledger_lib
from tff_dp.errors import UserInputError
from tff_dp import run_format
from tff_dp.run_format import columns
from tff_dp.run_format import metrics_csv

# Paper result keys that are not evaluation metrics of the model.
PRIVACY_AND_SCHEDULE_KEYS = ('epsilon', 'delta', 'rounds')

# config.json keys that name or place a run rather than set it up: two runs differing only in
# these (and in seeds) are repeats of one arm.
_IDENTITY_KEYS = ('experiment_name', 'root_output_dir', 'resume')


def is_seed_key(key: str) -> bool:
  """`seed`, or any `*_seed` a run records (a seed chosen apart from the main one)."""
  return key == 'seed' or key.endswith('_seed')


def seed_group_key(config: dict) -> str:
  """What identifies an arm across seeds: config.json without its seeds, run name and place.

  Runs with equal keys are the same arm run with (possibly) different seeds, so a table can
  show them side by side and summarise them. Keys starting with '_' (e.g. `_written_at`) are
  bookkeeping, not settings.
  """
  settings = {k: v for k, v in config.items()
              if not (is_seed_key(k) or k in _IDENTITY_KEYS or k.startswith('_'))}
  return json.dumps(settings, sort_keys=True, default=str)


@dataclasses.dataclass
class RunResult:
  """One run, summarised. `curve` holds per-round series for the cross-run plots."""
  path: str
  name: str
  config: dict
  paper_table: str
  paper_arm: str
  paper_results: dict
  rounds_completed: int
  delta: Optional[float]
  epsilon: Optional[float]            # After the last ledger record, at `delta`.
  final_eval: dict                    # eval metric name (without 'eval_') -> last value.
  final_eval_round: Optional[int]
  curve: dict                         # column -> list of (round, value), finite values only.
  epsilon_curve: list                 # [(round, epsilon)] from the ledger replay.

  @property
  def label(self) -> str:
    return self.paper_arm or self.name

  @property
  def seed(self) -> Optional[int]:
    """The run's --seed as config.json records it (None for a config without one)."""
    seed = self.config.get('seed')
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

  @property
  def seed_group(self) -> str:
    return seed_group_key(self.config)


def _epsilon_curve(ledger_path: str, delta: float, method: str) -> list[tuple[int, float]]:
  from tff_dp.accounting import accountant  # pylint: disable=g-import-not-at-top
  records = ledger_lib.read_ledger(ledger_path)
  if not records:
    return []
  # One PLD evaluation (at the end) is enough for a table; RDP is cheap at every round.
  pld_every = len(records) if method == 'pld' else None
  curve = accountant.epsilon_curve(records, delta, (method,),
                                  accountant.default_relation(records), pld_every=pld_every)
  return [(int(p['round']), p[f'epsilon_{method}']) for p in curve
          if p[f'epsilon_{method}'] is not None]


def read_run(path: str, *, delta: Optional[float] = None, method: str = 'rdp') -> RunResult:
  """Summarises the run directory at `path`.

  Args:
    path: a run directory written by `run_experiment.py` (or `tff_dp.training.experiment`).
    delta: delta for epsilon; default the paper's delta named by the run, else the run's own.
    method: accountant for the replay, 'rdp' or 'pld'.
  """
  config_path = os.path.join(path, run_format.CONFIG_FILE)
  if not os.path.isfile(config_path):
    raise UserInputError(f'{path} is not a run directory (no config.json)')
  try:
    with open(config_path) as f:
      config = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise UserInputError(f'{config_path} is unreadable: {e}') from None
  rows = metrics_csv.read_numeric_rows(os.path.join(path, run_format.METRICS_FILE))
  paper = config.get('paper_results') or {}
  if delta is None:
    delta = paper.get('delta') or config.get('delta_used')

  curve: dict[str, list] = {}
  for row in rows:
    for key, value in row.items():
      if key != 'round' and not math.isnan(value) and not math.isnan(row.get('round', math.nan)):
        curve.setdefault(key, []).append((int(row['round']), value))
  final_eval, final_round = {}, None
  for key in columns.names_with_role(curve, columns.EVAL):
    points = curve[key]
    final_eval[key[len('eval_'):]] = points[-1][1]
    final_round = max(final_round or 0, points[-1][0])

  ledger_path = os.path.join(path, run_format.LEDGER_FILE)
  eps_curve = (_epsilon_curve(ledger_path, float(delta), method)
               if delta is not None and os.path.exists(ledger_path) else [])
  return RunResult(
      path=path, name=os.path.basename(os.path.normpath(path)), config=config,
      paper_table=config.get('paper_table') or '', paper_arm=config.get('paper_arm') or '',
      paper_results=dict(paper),
      rounds_completed=int(max((r['round'] for r in rows), default=0)),
      delta=None if delta is None else float(delta),
      epsilon=eps_curve[-1][1] if eps_curve else (None if config.get('dp') != 'none'
                                                   else math.inf),
      final_eval=final_eval, final_eval_round=final_round,
      curve=curve, epsilon_curve=eps_curve)
