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


def _mean_sd(values: Iterable[Optional[float]]) -> str:
  """'mean ± sd' (sample standard deviation, n - 1) of the values reported; '–' if none."""
  xs = [float(x) for x in values if x is not None and not math.isnan(x)]
  if not xs:
    return '–'
  if any(math.isinf(x) for x in xs):
    return '∞' if all(x == math.inf for x in xs) else '–'
  if len(xs) == 1:
    return _num(xs[0])
  mean = sum(xs) / len(xs)
  sd = math.sqrt(sum((x - mean)**2 for x in xs) / (len(xs) - 1))
  return f'{_num(mean)} ± {_num(sd)}'


def seed_groups(results: Sequence[RunResult]) -> list[list[RunResult]]:
  """Runs grouped by arm (config equal but for the seeds), in order of first appearance; each
  group ordered by seed. A group of several runs is one arm run with several seeds."""
  groups: dict[str, list[RunResult]] = {}
  for r in results:
    groups.setdefault(r.seed_group, []).append(r)
  return [sorted(g, key=lambda r: (r.seed is None, r.seed or 0)) for g in groups.values()]


def _seed_cell(r: RunResult) -> str:
  return '–' if r.seed is None else str(r.seed)


def render_group(title: str, results: Sequence[RunResult]) -> str:
  keys = metric_keys(results)
  header = ['run', 'arm', 'seed', 'clients (pop.)', 'rounds', 'paper rounds', 'delta',
            'epsilon', 'paper epsilon']
  for k in keys:
    header += [k, f'paper {k}']
  lines = [f'### {title}', '', '| ' + ' | '.join(header) + ' |',
           '|' + '|'.join(['---'] * len(header)) + '|']
  any_repeats = False
  for group in seed_groups(results):
    for r in group:
      p = r.paper_results
      cells = [f'`{r.name}`', r.paper_arm or '–', _seed_cell(r),
               f'{r.config.get("clients_per_round", "–")} '
               f'({r.config.get("population_size", "–")})',
               str(r.rounds_completed), _num(p.get('rounds')), _num(r.delta, 2),
               _num(r.epsilon), _num(p.get('epsilon'))]
      for k in keys:
        cells += [_num(r.final_eval.get(k)), _num(p.get(k))]
      lines.append('| ' + ' | '.join(cells) + ' |')
    if len(group) > 1:   # One arm, several seeds: the summary row under its runs.
      any_repeats = True
      first, p = group[0], group[0].paper_results
      cells = [f'mean ± sd ({len(group)} runs)', first.paper_arm or '–',
               ', '.join(_seed_cell(r) for r in group),
               f'{first.config.get("clients_per_round", "–")} '
               f'({first.config.get("population_size", "–")})',
               _mean_sd(r.rounds_completed for r in group), _num(p.get('rounds')),
               _num(first.delta, 2), _mean_sd(r.epsilon for r in group), _num(p.get('epsilon'))]
      for k in keys:
        cells += [_mean_sd(r.final_eval.get(k) for r in group), _num(p.get(k))]
      lines.append('| ' + ' | '.join(cells) + ' |')
  lines += ['', 'Ours: final evaluation of the run; epsilon replayed from its ledger at the '
            'delta shown (the paper\'s delta when the run names one). "–": not reported.']
  if any_repeats:
    lines += ['"mean ± sd": over the runs just above it, whose config.json differs only in the '
              'seed (sample standard deviation, n - 1).']
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
