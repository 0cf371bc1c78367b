"""Renders run results as Markdown tables, ours side by side with the paper's numbers."""

import math
from typing import Iterable, Optional, Sequence

from tff_dp.tables.run_results import PRIVACY_AND_SCHEDULE_KEYS
from tff_dp.tables.run_results import RunResult


def _num(x: Optional[float], digits: int = 4) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return '–'
  if math.isinf(x):
    return '∞'
  if float(x).is_integer() and abs(x) >= 1:
    return str(int(x))
  return f'{x:.{digits}g}'


def metric_keys(results: Sequence[RunResult]) -> list[str]:
  """Metrics to show: accuracy, those the paper reports, and checkpoint-aggregate accuracies."""
  keys: list[str] = ['accuracy']
  for r in results:
    for k in r.paper_results:
      if k not in PRIVACY_AND_SCHEDULE_KEYS and k not in keys:
        keys.append(k)
  for r in results:
    for k in r.final_eval:
      if k.endswith('_accuracy') and k.startswith(('ema_', 'past_k_')) and k not in keys:
        keys.append(k)
  return keys


def group_by_table(results: Iterable[RunResult]) -> dict[str, list[RunResult]]:
  groups: dict[str, list[RunResult]] = {}
  for r in results:
    groups.setdefault(r.paper_table or 'Runs without a paper reference', []).append(r)
  return groups


def render_group(title: str, results: Sequence[RunResult]) -> str:
  keys = metric_keys(results)
  header = ['run', 'arm', 'clients (pop.)', 'rounds', 'paper rounds', 'delta',
            'epsilon', 'paper epsilon']
  for k in keys:
    header += [k, f'paper {k}']
  lines = [f'### {title}', '', '| ' + ' | '.join(header) + ' |',
           '|' + '|'.join(['---'] * len(header)) + '|']
  for r in results:
    p = r.paper_results
    cells = [f'`{r.name}`', r.paper_arm or '–',
             f'{r.config.get("clients_per_round", "–")} ({r.config.get("population_size", "–")})',
             str(r.rounds_completed), _num(p.get('rounds')), _num(r.delta, 2),
             _num(r.epsilon), _num(p.get('epsilon'))]
    for k in keys:
      cells += [_num(r.final_eval.get(k)), _num(p.get(k))]
    lines.append('| ' + ' | '.join(cells) + ' |')
  lines += ['', 'Ours: final evaluation of the run; epsilon replayed from its ledger at the '
            'delta shown (the paper\'s delta when the run names one). "–": not reported.']
  notes = []
  for r in results:
    note = r.config.get('paper_note') or ''
    if note and note not in notes:
      notes.append(note)
  lines += [f'- Paper: {n}' for n in notes] + ['']
  return '\n'.join(lines)


def render(results: Sequence[RunResult], *, preamble: str = '') -> str:
  parts = ['# Results vs the papers', '']
  if preamble:
    parts += [preamble, '']
  for title, group in group_by_table(results).items():
    parts.append(render_group(title, group))
  return '\n'.join(parts)
