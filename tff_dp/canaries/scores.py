"""canary_scores.csv: every canary's scores at each evaluation round, the data every canary
bound and diagnostic is computed from (`audit`), so that a reviewer can recompute them from a
finished run (`python -m tff_dp.canaries`) without training again.

One row per (round, canary): `round`, `canary` (its index: inserted canaries first, then the
held-out ones), `inserted` (1 or 0), `final_model` (the cosine of the canary's direction with
the model's total change since round 0) and `all_iterates` (the largest cosine with one
round's change so far). The scores are functions of the released models and the canaries'
secret directions, which are independent of every real client's data: post-processing of
covered outputs, covered like them. They tell which canaries were inserted, which is about no
real client.
"""

import csv
import dataclasses
import os
from typing import Optional

import numpy as np

from tff_dp import atomic_write

FILE = 'canary_scores.csv'
FIELDS = ('round', 'canary', 'inserted', 'final_model', 'all_iterates')
THREAT_MODELS = ('final_model', 'all_iterates')


@dataclasses.dataclass(frozen=True)
class Scores:
  """The scores of every canary at one round (arrays in canary order)."""
  inserted: np.ndarray      # bool
  final_model: np.ndarray   # float64
  all_iterates: np.ndarray  # float64

  def of(self, threat_model: str) -> np.ndarray:
    return getattr(self, threat_model)


def append(path: str, round_num: int, scores: Scores) -> None:
  """Appends round `round_num`'s rows (the header first, in a new file)."""
  new = not os.path.exists(path)
  with open(path, 'a', newline='') as f:
    writer = csv.writer(f)
    if new:
      writer.writerow(FIELDS)
    for k, (ins, final, every) in enumerate(zip(scores.inserted, scores.final_model,
                                                 scores.all_iterates)):
      writer.writerow((round_num, k, int(ins), repr(float(final)), repr(float(every))))
    f.flush()
    os.fsync(f.fileno())


def read(path: str, canaries: Optional[int] = None) -> dict[int, Scores]:
  """{round: its scores}, rounds in file order (a round written twice: its last rows).

  ValueError for a file that is not whole: no scores, a last line cut short, a round whose
  canaries are not 0, 1, ... in order, or rounds of different sizes (`canaries`: the number
  each round must have, inserted and held out)."""
  with open(path, newline='') as f:
    text = f.read()
  if text and not text.endswith('\n'):
    raise ValueError(f'{path}: its last line is cut short (the file is not whole)')
  rows: dict[int, list] = {}
  reader = csv.DictReader(text.splitlines())
  if tuple(reader.fieldnames or ()) != FIELDS:
    raise ValueError(f'{path}: not a canary scores file (columns {reader.fieldnames})')
  for row in reader:
    round_num, canary = int(row['round']), int(row['canary'])
    if canary == 0:
      rows[round_num] = []
    if round_num not in rows or canary != len(rows[round_num]):
      raise ValueError(f'{path}: round {round_num} lists canary {canary} out of order (the file '
                       'is not whole)')
    rows[round_num].append((row['inserted'] == '1', float(row['final_model']),
                            float(row['all_iterates'])))
  if not rows:
    raise ValueError(f'{path}: holds no scores')
  sizes = {len(v) for v in rows.values()} | ({canaries} if canaries is not None else set())
  if len(sizes) > 1:
    raise ValueError(f'{path}: rounds hold {sorted(sizes)} canaries each where every round '
                     'holds all of them (the file is not whole)')
  return {r: Scores(np.array([x[0] for x in v], bool), np.array([x[1] for x in v]),
                    np.array([x[2] for x in v])) for r, v in rows.items()}


def keep_through(path: str, round_num: int) -> None:
  """Drops the rows of rounds after `round_num` (a resume re-executes them)."""
  if not os.path.exists(path):
    return
  with open(path, newline='') as f:
    lines = f.read().splitlines(keepends=True)
  kept = lines[:1] + [line for line in lines[1:] if int(line.split(',', 1)[0]) <= round_num]
  if len(kept) != len(lines):
    atomic_write.write_text(path, ''.join(kept))
