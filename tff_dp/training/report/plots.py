"""PNG plots written by every run: epsilon vs round, clip norm(s) vs round, accuracy vs epsilon,
and, in a run with canaries, estimated vs proven epsilon vs round.

Every epsilon axis states the delta and the accountant; every curve has markers, so a run of
one round still shows its point.
"""

import math
import os
from typing import Mapping, Optional

from tff_dp import plot_axes
from tff_dp.run_format import columns as columns_lib
from tff_dp.run_format import metrics_csv as metrics_csv_lib  # noqa: E402


def _read_columns(metrics_csv: str) -> dict[str, list[float]]:
  columns: dict[str, list[float]] = {}
  for row in metrics_csv_lib.read_numeric_rows(metrics_csv):
    for key, value in row.items():
      columns.setdefault(key, []).append(value)
  return columns


def _finite_pairs(xs, ys):
  pairs = [(x, y) for x, y in zip(xs, ys) if math.isfinite(x) and math.isfinite(y)]
  return [p[0] for p in pairs], [p[1] for p in pairs]


def _clip_label(column: str, group_labels: Mapping[str, str]) -> str:
  label = column.replace('aggregator/', '').replace('privacy_queries/', '').replace(
      '/l2_norm_clip', '')
  group = label.rsplit('/', 1)[-1]
  return f'{group}: {group_labels[group]}' if group in group_labels else label


def _every(xs, values) -> Optional[int]:
  """The spacing, in rounds, of a curve computed only at some rounds (the PLD accountant's every
  `pld_every` rounds, canary audits at evaluations): None when it has a value at every round of
  its span. Such a curve is drawn as its points: a line would show values never computed."""
  finite = [i for i, v in enumerate(values) if math.isfinite(v)]
  if len(finite) < 2 or finite[-1] - finite[0] + 1 == len(finite):
    return None
  steps = {xs[b] - xs[a] for a, b in zip(finite, finite[1:])}
  return int(min(steps))


def _epsilon_figure(rounds, curves, ylabel: str, title: str, legend_below: bool = False):
  """Epsilon curves [(values, label, line style)] against rounds, from zero, with room above;
  a curve computed only at some rounds is drawn as points and says how often. `legend_below`:
  the legend under the axes (many or long entries), never over the data."""
  fig, ax = plot_axes.new_axes((7, 6.5) if legend_below else (6, 4))
  for values, label, style in curves:
    every = _every(rounds, values)
    if every is not None:
      style, label = '', f'{label} (points: computed every {every} rounds)'
    ax.plot(*_finite_pairs(rounds, values), marker='o', markersize=3, linestyle=style,
            label=label)
  ax.set(xlabel='round', ylabel=ylabel, title=title)
  ax.set_ylim(0, ax.get_ylim()[1] * 1.08)
  plot_axes.round_axis(ax, rounds)
  if legend_below:
    ax.legend(fontsize='x-small', loc='upper left', bbox_to_anchor=(0, -0.14), borderaxespad=0)
  else:
    ax.legend(fontsize='small')
  return fig


# The evaluation data (`eval_data`, as `build_evaluation.Evaluation.description` names it) on an
# accuracy axis; the privacy statement says the same at length.
_EVAL_AXIS = {
    'holdout': 'accuracy on held-out clients\n(not in the training population)',
    'test_disjoint': 'accuracy on the test split\n(clients outside the training population)',
    'test_shared': 'accuracy on the test split\n(training clients\' own data: not private)',
    'public_test': 'accuracy on the public test split',
}


def write_run_plots(metrics_csv: str, out_dir: str, *, delta: Optional[float] = None,
                    clip_group_labels: Optional[Mapping[str, str]] = None,
                    projection_delta: Optional[float] = None,
                    model_labels: Optional[Mapping[str, str]] = None,
                    eval_data: Optional[str] = None, simulation: bool = False) -> list[str]:
  """Writes the standard plots for a run's metrics CSV; returns the paths written.

  `delta`: the delta of the epsilon columns (named on the axis). `clip_group_labels`:
  'group_g' -> the names of its weights, for per-group clip curves. `projection_delta`: the
  delta of a noise cohort's projected_epsilon columns. `model_labels`: {name: what it is} of
  the models in eval_<name>_accuracy columns. `eval_data`: where evaluation ran (its axis).
  `simulation`: a noise-cohort run, whose own epsilon is not the production run's.
  """
  if not os.path.exists(metrics_csv):
    return []
  cols = _read_columns(metrics_csv)
  figures = (_epsilon_figures(cols, delta, projection_delta, simulation)
             + _clip_figures(cols, clip_group_labels or {})
             + _accuracy_figures(cols, delta, model_labels or {}, eval_data))
  os.makedirs(out_dir, exist_ok=True)
  written = []
  for fig, name in figures:
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches='tight')   # Legends outside the axes included.
    written.append(path)
  return written


def _with_numbers(cols, role) -> list[str]:
  """The columns of `role` with at least one number (PLD of a tree run is n/a throughout)."""
  return [k for k in columns_lib.names_with_role(cols, role)
          if not all(math.isnan(v) for v in cols[k])]


def _accounted_figure(cols, keys, delta, title):
  """One curve per accountant's epsilon column in `keys`, against rounds."""
  accountant = plot_axes.accountant_name
  return _epsilon_figure(
      cols.get('round', []), [(cols[k], f'{accountant(k)} accountant', '-') for k in keys],
      plot_axes.epsilon_axis_label(delta, [accountant(k) for k in keys]), title)


def _epsilon_figures(cols, delta, projection_delta, simulation: bool) -> list:
  """[(figure, file name)]: the run's epsilon, a noise cohort's projection, and canary
  estimates beside the proven bound."""
  rounds, accountant, figures = cols.get('round', []), plot_axes.accountant_name, []
  eps_cols = _with_numbers(cols, columns_lib.EPSILON)
  if eps_cols:
    title = ('This simulation\'s own epsilon (few clients, little noise each): the production\n'
             'run\'s is in projected_epsilon_vs_round.png' if simulation
             else 'Privacy spent (accounted from the ledger)')
    figures.append((_accounted_figure(cols, eps_cols, delta, title), 'epsilon_vs_round.png'))
  projected_cols = _with_numbers(cols, columns_lib.PROJECTED_EPSILON)
  if projected_cols:
    figures.append((_accounted_figure(
        cols, projected_cols, projection_delta,
        'Projected epsilon of the production run (noise cohort):\n'
        'not a guarantee for this run\'s clients'), 'projected_epsilon_vs_round.png'))
  estimate_cols = _with_numbers(cols, columns_lib.CANARY_EPSILON)
  bound_cols = _with_numbers(cols, columns_lib.CANARY_BOUND)
  if estimate_cols or bound_cols:
    curves = ([(cols[k], f'proven epsilon ({accountant(k)} accountant): the ceiling', '-')
               for k in eps_cols]
              + [(cols[k], columns_lib.column(k).meaning, '--') for k in estimate_cols]
              + [(cols[k], columns_lib.column(k).meaning, '') for k in bound_cols])
    at = f' at delta = {delta:.3g}' if delta is not None else ''
    figures.append((_epsilon_figure(rounds, curves, f'epsilon{at}',
                                    'Canary estimates and lower bounds on epsilon\n'
                                    'beside the proven epsilon (their ceiling)',
                                    legend_below=True),
                    'epsilon_estimated_vs_proven.png'))
  return figures


def _clip_figures(cols, clip_group_labels: Mapping[str, str]) -> list:
  """[(the clip norm(s) against rounds, its file name)], or [] without clip columns."""
  clip_cols = sorted(columns_lib.names_with_role(cols, columns_lib.CLIP))
  if not clip_cols:
    return []
  rounds = cols.get('round', [])
  fig, ax = plot_axes.new_axes((6, 4))
  for k in clip_cols[:20]:
    ax.plot(*_finite_pairs(rounds, cols[k]), marker='o', markersize=2,
            label=_clip_label(k, clip_group_labels))
  ax.set(xlabel='round', ylabel='clip norm (L2)', title='Clip norm used in each round')
  plot_axes.round_axis(ax, rounds)
  plot_axes.readable_log_axis(ax, [v for k in clip_cols for v in cols[k]])
  ax.legend(fontsize='x-small' if len(clip_cols) > 4 else 'small')
  return [(fig, 'clip_vs_round.png')]


def _accuracy_figures(cols, delta, model_labels: Mapping[str, str],
                      eval_data: Optional[str]) -> list:
  """[(evaluation accuracy against epsilon, or against rounds without DP, its file name)]."""
  acc_cols = sorted(k for k in columns_lib.names_with_role(cols, columns_lib.EVAL)
                    if k.endswith('accuracy'))
  if not acc_cols:
    return []
  eps_cols = _with_numbers(cols, columns_lib.EPSILON)
  xname = eps_cols[0] if eps_cols else 'round'
  fig, ax = plot_axes.new_axes((6, 4))
  for k in acc_cols:
    model = k[len('eval_'):-len('_accuracy')] if k != 'eval_accuracy' else 'last iterate'
    ax.plot(*_finite_pairs(cols[xname], cols[k]), marker='.',
            label=model_labels.get(model, model))
  ax.set(xlabel=(plot_axes.epsilon_axis_label(delta, [plot_axes.accountant_name(xname)])
                 if eps_cols else 'round'),
         ylabel=_EVAL_AXIS.get(eval_data, 'eval accuracy'),
         title='Accuracy vs privacy' if eps_cols else 'Accuracy vs round')
  ax.legend(fontsize='small')
  return [(fig, 'accuracy_vs_epsilon.png' if eps_cols else 'accuracy_vs_round.png')]
