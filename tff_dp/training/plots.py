"""PNG plots written by every run: epsilon vs round, clip norm(s) vs round, accuracy vs epsilon."""

import math
import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=g-import-not-at-top

from tff_dp.training import metrics_file  # noqa: E402


def _read_columns(metrics_csv: str) -> dict[str, list[float]]:
  columns: dict[str, list[float]] = {}
  for row in metrics_file.read_rows(metrics_csv):
    for key, value in row.items():
      columns.setdefault(key, []).append(value)
  return columns


def _finite_pairs(xs, ys):
  pairs = [(x, y) for x, y in zip(xs, ys) if not (math.isnan(x) or math.isnan(y))]
  return [p[0] for p in pairs], [p[1] for p in pairs]


def write_run_plots(metrics_csv: str, out_dir: str) -> list[str]:
  """Writes the standard plots for a run's metrics CSV; returns the paths written."""
  if not os.path.exists(metrics_csv):
    return []
  cols = _read_columns(metrics_csv)
  rounds = cols.get('round', [])
  written = []
  os.makedirs(out_dir, exist_ok=True)

  def save(fig, name):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)

  eps_cols = [k for k in ('epsilon_rdp', 'epsilon_pld') if k in cols]
  if eps_cols:
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in eps_cols:
      ax.plot(*_finite_pairs(rounds, cols[k]), label=k.replace('epsilon_', '').upper())
    ax.set(xlabel='round', ylabel='epsilon', title='Privacy spent (from the ledger)')
    ax.legend()
    save(fig, 'epsilon_vs_round.png')

  clip_cols = sorted(k for k in cols if metrics_file.is_clip_column(k))
  if clip_cols:
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in clip_cols[:20]:
      label = k.replace('aggregator/', '').replace('privacy_queries/', '').replace(
          '/l2_norm_clip', '')
      ax.plot(*_finite_pairs(rounds, cols[k]), label=label)
    ax.set(xlabel='round', ylabel='clip norm', title='Clip norm per round')
    if min(min(v for v in cols[k] if not math.isnan(v)) for k in clip_cols) > 0:
      ax.set_yscale('log')
    ax.legend(fontsize='small')
    save(fig, 'clip_vs_round.png')

  acc_cols = sorted(k for k in cols if k.startswith('eval_') and k.endswith('accuracy'))
  if acc_cols:
    xname = eps_cols[0] if eps_cols else 'round'
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in acc_cols:
      label = k.replace('eval_', '').replace('_accuracy', '').replace('accuracy', 'last iterate')
      ax.plot(*_finite_pairs(cols[xname], cols[k]), marker='.', label=label)
    ax.set(xlabel='epsilon' if eps_cols else 'round', ylabel='eval accuracy',
           title='Accuracy vs privacy' if eps_cols else 'Accuracy vs round')
    ax.legend(fontsize='small')
    save(fig, 'accuracy_vs_epsilon.png' if eps_cols else 'accuracy_vs_round.png')
  return written
