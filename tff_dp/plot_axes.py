"""Axes a reader can check, shared by a run's plots (`tff_dp.training.report.plots`) and the paper
tables' plots (`tff_dp.tables.plots`): epsilon axes that state delta and the accountant, clip
axes in plain numbers, integer round axes."""

import math
from typing import Optional, Sequence

from matplotlib import figure
from matplotlib import ticker


def new_axes(figsize: tuple):
  """(figure, axes) drawn without pyplot: no backend is selected and no global figure list is
  touched, so a run's plots change nothing in the caller's matplotlib (`Figure.savefig` renders
  PNG by itself)."""
  fig = figure.Figure(figsize=figsize)
  return fig, fig.subplots()


def accountant_name(epsilon_column: str) -> str:
  """'RDP' for the column epsilon_rdp (the accountant an epsilon column was computed with)."""
  return epsilon_column.rsplit('_', 1)[-1].upper()


def epsilon_axis_label(delta: Optional[float], accountants: Sequence[str]) -> str:
  """'epsilon at delta = 1e-05\\n(RDP accountant)': what an epsilon axis must say to be
  checkable (delta None: runs differ in delta, and each legend entry names its own)."""
  at = f' at delta = {delta:.3g}' if delta is not None else ''
  return f'epsilon{at}\n({" / ".join(accountants)} accountant)'


def readable_log_axis(ax, values) -> None:
  """Log scale with plain-number ticks (1-2-5 per decade) when the values span more than a
  decade; a linear axis in plain numbers (no offset, no scientific notation) otherwise: a log
  axis over less than a decade shows two labelled ticks or none (0.1 and 0.2 for a clip curve
  from 0.1 to 0.37)."""
  values = [v for v in values if v > 0 and math.isfinite(v)]
  if values and max(values) / min(values) > 10:
    ax.set_yscale('log')
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
  else:
    plain = ticker.ScalarFormatter(useOffset=False)
    plain.set_scientific(False)
    ax.yaxis.set_major_formatter(plain)


def round_axis(ax, rounds) -> None:
  """Integer round ticks, with room around a single round (else matplotlib spans +-5%)."""
  finite = [r for r in rounds if math.isfinite(r)]
  if finite and min(finite) == max(finite):
    ax.set_xlim(finite[0] - 1, finite[0] + 1)
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
