"""The per-round metrics CSV (written by `run_dir.MetricsCsv`) read back as numbers, which of its
columns hold clip norms, and the columns of the canaries' epsilon estimates. Shared by the run's
own plots, the console line and the paper tables, so they agree on what a column means."""

import csv
import math
import os

# The canaries' empirical epsilon estimates at the run's delta (tff_dp.training.canary_run),
# with how plots and tables name them.
CANARY_EPSILON_COLUMNS = {
    'canary_epsilon_final_model': 'canary estimate, final model',
    'canary_epsilon_all_iterates': 'canary estimate, all iterates',
}


def is_clip_column(key: str) -> bool:
  """A clip norm of the update (flat, per group or per layer), not the clipped-count query's."""
  return key.endswith('l2_norm_clip') and 'clipped_count' not in key


def _float_or_nan(value) -> float:
  try:
    return float(value) if value not in ('', None) else math.nan
  except ValueError:
    return math.nan


def read_rows(path: str) -> list[dict[str, float]]:
  """One dict per round; empty or non-numeric cells are NaN; [] if the file does not exist."""
  if not os.path.exists(path):
    return []
  with open(path, newline='') as f:
    return [{k: _float_or_nan(v) for k, v in row.items() if k is not None}
            for row in csv.DictReader(f)]
