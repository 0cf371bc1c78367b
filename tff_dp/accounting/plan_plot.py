"""The privacy planner's picture (`python -m tff_dp.accounting --plan`): one panel per
mechanism, epsilon against rounds for each setting of the grid, the target epsilon marked.

Drawn on a `matplotlib.figure.Figure` (no pyplot): importing or calling this module selects no
backend and leaves no global figure state.
"""

from typing import Optional, Sequence

from matplotlib import ticker
from matplotlib.figure import Figure

from tff_dp import plot_axes


def _distinct(curves: Sequence) -> list[tuple[object, str]]:
  """[(curve, label)]: one line per noise multiplier whose curves are the same for every
  cohort size (labelled 'any clients/round'), else one per setting."""
  drawn = []
  for z in dict.fromkeys(c.noise_multiplier for c in curves):
    same_z = [c for c in curves if c.noise_multiplier == z]
    if len(same_z) > 1 and len({c.epsilons for c in same_z}) == 1:
      drawn.append((same_z[0], f'z = {z:g}, any clients/round (same curve)'))
    else:
      drawn += [(c, f'z = {z:g}, {c.clients_per_round} clients/round') for c in same_z]
  return drawn


def draw(curves: Sequence, path: str, *, delta: float, population: int,
         target_epsilon: Optional[float] = None, descriptions: Optional[dict] = None,
         notes: Optional[dict] = None) -> None:
  """Writes the PNG at `path`: a panel per mechanism of `curves` (`planner.Curve`s);
  `notes`: mechanism -> a note written on its panel (what its z means)."""
  mechanisms = list(dict.fromkeys(c.mechanism for c in curves))
  columns = 2 if len(mechanisms) > 1 else 1
  rows = -(-len(mechanisms) // columns)
  fig = Figure(figsize=(6.4 * columns, 4.2 * rows), layout='constrained')
  axes = fig.subplots(rows, columns, squeeze=False).ravel()
  for ax, mechanism in zip(axes, mechanisms):
    mine = [c for c in curves if c.mechanism == mechanism]
    for c, label in _distinct(mine):
      ax.plot(c.rounds, c.epsilons, marker='.', markersize=3, label=label)
    note = (notes or {}).get(mechanism)
    if note:
      ax.text(0.02, 0.02, note, transform=ax.transAxes, fontsize=7, va='bottom',
              bbox=dict(facecolor='white', alpha=0.85, edgecolor='0.7'))
    if target_epsilon is not None:
      ax.axhline(target_epsilon, color='black', linestyle='--', linewidth=1,
                 label=f'target epsilon {target_epsilon:g}')
    ax.set_xscale('log')
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
    ax.set_xlabel('rounds (a run of that many rounds)')
    ax.set_ylabel(plot_axes.epsilon_axis_label(delta, ['RDP']))
    plot_axes.readable_log_axis(ax, [e for c in mine for e in c.epsilons])
    described = (descriptions or {}).get(mechanism)   # Named as the table's rows name it.
    title = f'{mechanism}: {described}' if described else mechanism
    ax.set_title(f'{title}\npopulation {population:,}', fontsize=9)
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=7)
  for ax in axes[len(mechanisms):]:
    ax.set_visible(False)
  fig.savefig(path, dpi=110)
