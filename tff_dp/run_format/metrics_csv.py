"""metrics.csv: one row per round, its columns declared in `columns`; written append-only
(`MetricsCsv`) and read back as numbers (`read_numeric_rows`)."""

import csv
import math
import os
from typing import Any, Mapping

from tff_dp import atomic_write


class MetricsCsv:
  """Append-only per-round CSV whose header grows when new metric columns appear.

  A new column forces a rewrite of the file with the union header; the rewrite goes through a
  temporary file and an atomic rename, so a crash never loses rows already written.
  """

  def __init__(self, path: str):
    self.path = path
    self._columns: list[str] = []
    if os.path.exists(path):
      with open(path, newline='') as f:
        reader = csv.reader(f)
        self._columns = next(reader, [])

  def read_rows(self) -> list[dict[str, str]]:
    if not os.path.exists(self.path):
      return []
    with open(self.path, newline='') as f:
      return list(csv.DictReader(f))

  def _rewrite(self, rows, columns) -> None:
    with atomic_write.replacing(self.path, newline='') as f:
      writer = csv.DictWriter(f, fieldnames=columns, restval='')
      writer.writeheader()
      writer.writerows(rows)
    self._columns = list(columns)

  def append(self, row: Mapping[str, Any]) -> None:
    row = {k: _csv_value(v) for k, v in row.items()}
    new_columns = [k for k in row if k not in self._columns]
    if new_columns or not os.path.exists(self.path):
      self._rewrite(self.read_rows(), self._columns + new_columns)
    with open(self.path, 'a', newline='') as f:
      csv.DictWriter(f, fieldnames=self._columns, restval='').writerow(row)
      f.flush()
      os.fsync(f.fileno())

  def move_rows_after(self, round_num: int, superseded_path: str) -> int:
    """Moves rows with round > round_num to `superseded_path` (kept, not deleted); returns count."""
    rows = self.read_rows()
    keep = [r for r in rows if int(r['round']) <= round_num]
    moved = [r for r in rows if int(r['round']) > round_num]
    if moved:
      exists = os.path.exists(superseded_path)
      with open(superseded_path, 'a', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=self._columns, restval='')
        if not exists:
          writer.writeheader()
        writer.writerows(moved)
      self._rewrite(keep, self._columns)
    return len(moved)


def _csv_value(v):
  if isinstance(v, float) and math.isnan(v):
    return 'nan'
  return v


def _float_or_nan(value) -> float:
  try:
    return float(value) if value not in ('', None) else math.nan
  except ValueError:
    return math.nan


def read_numeric_rows(path: str) -> list[dict[str, float]]:
  """One dict per round; empty or non-numeric cells are NaN; [] if the file does not exist."""
  if not os.path.exists(path):
    return []
  with open(path, newline='') as f:
    return [{k: _float_or_nan(v) for k, v in row.items() if k is not None}
            for row in csv.DictReader(f)]
