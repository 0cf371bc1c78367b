"""Cross-run PNG plots for one table: accuracy, clip norm and epsilon vs round, accuracy vs eps."""

import hashlib
import os
import re
from typing import Sequence

from tff_dp import plot_axes
from tff_dp.run_format import columns
from tff_dp.tables.run_results import RunResult

# Model variants evaluated in a run: the last iterate and the checkpoint aggregates.
_VARIANTS = (('eval_accuracy', '', '-'), ('eval_ema_accuracy', ' (EMA)', '--'),
             ('eval_past_k_accuracy', ' (past-k)', ':'))


_SLUG_CHARS = 100


def slug(text: str) -> str:
  """`text` as a file-name prefix: lower-case words joined by '_'. Longer than 100 characters,
  cut to 91 plus 8 hex digits of the whole text's hash, so that two titles sharing a long
  prefix (one paper's tables) keep distinct plot files."""
  words = re.sub(r'[^a-z0-9]+', '_', text.lower()).strip('_') or 'runs'
  if len(words) <= _SLUG_CHARS:
    return words
  return f'{words[:_SLUG_CHARS - 9]}_{hashlib.sha256(text.encode()).hexdigest()[:8]}'


def series_labels(results: Sequence[RunResult]) -> list[str]:
  """One legend label per run, distinct where runs share an arm: the arm (or run name), plus
  the seed when several runs of the arm differ in seed, else the run directory's name."""
  by_label: dict[str, list[RunResult]] = {}
  for r in results:
    by_label.setdefault(r.label, []).append(r)
  labels = []
  for r in results:
    same = by_label[r.label]
    if len(same) == 1:
      labels.append(r.label)
    elif r.seed is not None and [x.seed for x in same].count(r.seed) == 1:
      labels.append(f'{r.label} (seed {r.seed})')
    else:
      labels.append(f'{r.label} ({r.name})')
  return labels


def _clip_columns(r: RunResult) -> list[str]:
  return sorted(columns.names_with_role(r.curve, columns.CLIP))


def _epsilon_label(results: Sequence[RunResult], accountant: str) -> str:
  """The epsilon axis: one delta if all runs share it (else each legend entry names its own)."""
  deltas = {r.delta for r in results if r.epsilon_curve}
  return plot_axes.epsilon_axis_label(deltas.pop() if len(deltas) == 1 else None,
                                      [accountant.upper()])


def write_plots(results: Sequence[RunResult], out_dir: str, prefix: str, *,
                accountant: str = 'rdp') -> list[str]:
  """Writes PREFIX_{accuracy_vs_round,clip_vs_round,epsilon_vs_round,accuracy_vs_epsilon}.png.

  `accountant` ('rdp' or 'pld'): the one the epsilon curves were replayed with."""
  os.makedirs(out_dir, exist_ok=True)
  written = []
  labels = series_labels(results)

  def save(fig, ax, name, title):
    ax.set_title(title, fontsize='medium')
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize='x-small')
    fig.tight_layout()
    path = os.path.join(out_dir, f'{prefix}_{name}.png')
    fig.savefig(path, dpi=100)
    written.append(path)

  fig, ax = plot_axes.new_axes((6.5, 4))
  for r, label in zip(results, labels):
    for col, suffix, style in _VARIANTS:
      if col in r.curve:
        ax.plot(*zip(*r.curve[col]), style, marker='.', label=label + suffix)
  ax.set(xlabel='round', ylabel='eval accuracy')
  save(fig, ax, 'accuracy_vs_round', 'Accuracy vs round')

  fig, ax = plot_axes.new_axes((6.5, 4))
  clip_values = []
  for r, label in zip(results, labels):
    cols = _clip_columns(r)
    if len(cols) == 1:
      ax.plot(*zip(*r.curve[cols[0]]), marker='.', label=label)
    elif cols:  # Per-layer / joint: one line per group would swamp the plot; show the range.
      by_round = {}
      for c in cols:
        for rnd, v in r.curve[c]:
          by_round.setdefault(rnd, []).append(v)
      rounds = sorted(by_round)
      line, = ax.plot(rounds, [sum(by_round[x]) / len(by_round[x]) for x in rounds],
                      label=f'{label} (mean of {len(cols)})')
      ax.fill_between(rounds, [min(by_round[x]) for x in rounds],
                      [max(by_round[x]) for x in rounds], alpha=0.2, color=line.get_color())
    clip_values += [v for c in cols for _, v in r.curve[c]]
  if ax.lines:
    plot_axes.readable_log_axis(ax, clip_values)
  ax.set(xlabel='round', ylabel='clip norm (L2)')
  save(fig, ax, 'clip_vs_round', 'Clip norm vs round')

  fig, ax = plot_axes.new_axes((6.5, 4))
  for r, label in zip(results, labels):
    if r.epsilon_curve:
      ax.plot(*zip(*r.epsilon_curve), marker='.', label=f'{label} (delta={r.delta:.3g})')
  ax.set(xlabel='round', ylabel=_epsilon_label(results, accountant))
  save(fig, ax, 'epsilon_vs_round', 'Epsilon vs round (replayed from each ledger)')

  fig, ax = plot_axes.new_axes((6.5, 4))
  for r, label in zip(results, labels):
    eps_at = dict(r.epsilon_curve)
    for col, suffix, style in _VARIANTS:
      pts = [(eps_at[rnd], v) for rnd, v in r.curve.get(col, []) if rnd in eps_at]
      if pts:
        ax.plot(*zip(*pts), style, marker='.', label=label + suffix)
  ax.set(xlabel=_epsilon_label(results, accountant), ylabel='eval accuracy')
  save(fig, ax, 'accuracy_vs_epsilon', 'Accuracy vs epsilon across runs')
  return written
