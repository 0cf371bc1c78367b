"""Run plots say what their axes are: delta and accountant on epsilon, readable clip ticks,
layer names on per-group clips, and a visible point for a one-round run."""

import csv

import pytest

from run_helpers import kept_figures
from tff_dp.training.report import plots

_CLIP = 'aggregator/privacy_queries/update/{}/l2_norm_clip'


def _write_csv(path, rows):
  keys = sorted({k for r in rows for k in r})
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
  return str(path)


@pytest.fixture
def figures(monkeypatch):
  return kept_figures(monkeypatch)


def _axes_by_file(figures, written):
  return {p.rsplit('/', 1)[-1]: f.axes[0] for p, f in zip(written, figures)}


def test_one_round_run_names_delta_and_accountant_and_shows_its_point(tmp_path, figures):
  csv_path = _write_csv(tmp_path / 'm.csv', [
      {'round': 1, 'epsilon_rdp': 0.8, 'epsilon_pld': 0.6, 'eval_accuracy': 0.3,
       _CLIP.format('group_0'): 0.1}])
  written = plots.write_run_plots(csv_path, str(tmp_path / 'plots'), delta=1e-5)
  axes = _axes_by_file(figures, written)
  eps = axes['epsilon_vs_round.png']
  assert eps.get_ylabel() == 'epsilon at delta = 1e-05\n(RDP / PLD accountant)'
  assert [line.get_label() for line in eps.lines] == ['RDP accountant', 'PLD accountant']
  assert all(len(line.get_xdata()) == 1 and line.get_marker() not in ('None', '', None)
             for line in eps.lines)
  assert (axes['accuracy_vs_epsilon.png'].get_xlabel()
          == 'epsilon at delta = 1e-05\n(RDP accountant)')


def _tick_labels(ax, figure):
  figure.canvas.draw()
  low, high = ax.get_ylim()
  return [t.get_text() for t in ax.get_yticklabels()
          if low <= t.get_position()[1] <= high and t.get_text()]


@pytest.mark.parametrize('low, high, scale', [(0.1, 0.12, 'linear'), (0.013, 0.019, 'linear'),
                                              (0.1, 0.37, 'linear'), (3e-4, 2e-3, 'linear'),
                                              (0.02, 40.0, 'log'), (0.3, 3.1, 'log')])
def test_clip_axis_has_readable_ticks_at_any_range(tmp_path, figures, low, high, scale):
  rows = [{'round': r, _CLIP.format('group_0'): low + (high - low) * r / 9} for r in range(10)]
  written = plots.write_run_plots(_write_csv(tmp_path / 'm.csv', rows), str(tmp_path / 'p'))
  ax = _axes_by_file(figures, written)['clip_vs_round.png']
  assert ax.get_yscale() == scale
  labels = _tick_labels(ax, figures[written.index(str(tmp_path / 'p' / 'clip_vs_round.png'))])
  assert len(labels) >= 3, labels   # A log axis within a decade had two (issue 37.10).
  # Plain numbers (no 10^k mathtext, no offset/scientific notation hiding the values).
  assert all('$' not in t and 'e' not in t.lower() for t in labels), labels
  assert ax.yaxis.get_offset_text().get_text() == ''


def test_per_group_clips_are_labelled_with_their_layer_names(tmp_path, figures):
  rows = [{'round': r, _CLIP.format('group_0'): 0.1, _CLIP.format('group_1'): 0.5}
          for r in (1, 2)]
  written = plots.write_run_plots(
      _write_csv(tmp_path / 'm.csv', rows), str(tmp_path / 'p'),
      clip_group_labels={'group_0': 'dense/kernel, dense/bias', 'group_1': 'out/kernel'})
  ax = _axes_by_file(figures, written)['clip_vs_round.png']
  assert [line.get_label() for line in ax.lines] == ['group_0: dense/kernel, dense/bias',
                                                     'group_1: out/kernel']


def test_one_round_gets_integer_round_ticks_around_it(tmp_path, figures):
  csv_path = _write_csv(tmp_path / 'm.csv', [{'round': 1, 'epsilon_rdp': 0.8}])
  written = plots.write_run_plots(csv_path, str(tmp_path / 'plots'), delta=1e-5)
  ax = _axes_by_file(figures, written)['epsilon_vs_round.png']
  figures[0].canvas.draw()
  low, high = ax.get_xlim()
  ticks = [t for t in ax.get_xticks() if low <= t <= high]
  assert low < 1 < high and 1 in ticks and all(float(t).is_integer() for t in ticks)
  assert ax.get_ylim()[0] == 0


def test_accuracy_legend_says_what_each_model_is_and_the_axis_where_it_was_evaluated(
    tmp_path, figures):
  rows = [{'round': r, 'epsilon_rdp': 0.5 * r, 'eval_accuracy': 0.1 * r,
           'eval_past_k_accuracy': 0.1 * r, 'eval_ema_accuracy': 0.1 * r} for r in (1, 2)]
  written = plots.write_run_plots(
      _write_csv(tmp_path / 'm.csv', rows), str(tmp_path / 'p'), delta=1e-5,
      model_labels={'past_k': 'average of the last 3 models'}, eval_data='holdout')
  ax = _axes_by_file(figures, written)['accuracy_vs_epsilon.png']
  assert [line.get_label() for line in ax.lines] == [
      'last iterate', 'ema', 'average of the last 3 models']   # 'ema': no label given.
  assert 'held-out clients' in ax.get_ylabel()


def test_a_noise_cohort_runs_own_epsilon_says_it_is_the_simulations(tmp_path, figures):
  rows = [{'round': r, 'epsilon_rdp': 40.0 * r, 'projected_epsilon_rdp': 0.1 * r}
          for r in (1, 2)]
  written = plots.write_run_plots(_write_csv(tmp_path / 'm.csv', rows), str(tmp_path / 'p'),
                                  delta=1e-5, projection_delta=1e-7, simulation=True)
  axes = _axes_by_file(figures, written)
  assert 'simulation' in axes['epsilon_vs_round.png'].get_title()
  assert 'projected_epsilon_vs_round.png' in axes['epsilon_vs_round.png'].get_title()
  assert 'not a guarantee' in axes['projected_epsilon_vs_round.png'].get_title()


def test_the_canary_legend_is_outside_the_data_and_sparse_curves_are_points(tmp_path, figures):
  """Issue 51, item 6: the canary figure's 8-entry legend lay over the data, off the image's
  left edge, its title cut; the PLD curve, computed every 10 rounds, was drawn as segments."""
  rows = []
  for r in range(1, 41):
    row = {'round': r, 'epsilon_rdp': 0.1 * r, 'epsilon_pld': 0.09 * r if r % 10 == 0 else ''}
    if r % 5 == 0:
      row.update({f'canary_epsilon_{t}': 0.05 * r for t in ('final_model', 'all_iterates')})
      row.update({f'canary_bound_{m}_{t}': 0.01 * r for m in ('one_run', 'clopper_pearson')
                  for t in ('final_model', 'all_iterates')})
    rows.append(row)
  written = plots.write_run_plots(_write_csv(tmp_path / 'm.csv', rows), str(tmp_path / 'p'),
                                  delta=1e-5)
  figure = dict(zip((p.rsplit('/', 1)[-1] for p in written), figures))
  canary = figure['epsilon_estimated_vs_proven.png']
  ax = canary.axes[0]
  from matplotlib.backends import backend_agg  # pylint: disable=g-import-not-at-top
  renderer = backend_agg.FigureCanvasAgg(canary).get_renderer()
  legend, data = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
  assert len(ax.get_legend().get_texts()) == 8
  assert legend.y1 < data.y0   # Under the axes, not over the data.
  image = canary.get_tightbbox(renderer).transformed(canary.dpi_scale_trans)   # Saved.
  for extent in (legend, ax.title.get_window_extent(renderer)):
    assert image.x0 <= extent.x0 and extent.x1 <= image.x1 + 1   # Whole in the image.
  by_label = {line.get_label(): line for line in figure['epsilon_vs_round.png'].axes[0].lines}
  assert by_label['RDP accountant'].get_linestyle() == '-'
  pld = by_label['PLD accountant (points: computed every 10 rounds)']
  assert pld.get_linestyle() == 'None' and list(pld.get_xdata()) == [10, 20, 30, 40]
