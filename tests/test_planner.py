"""The privacy planner (issue 28.3): its curves against dp_accounting built here, for each
mechanism, and its command line (a table, a PNG, bad input refused before anything is written)."""

import math
import os
import subprocess
import sys

import dp_accounting
import pytest

from tff_dp.accounting import planner
from run_helpers import REPO
from run_helpers import script_env

N, DELTA, Z, M = 10000, 1e-5, 1.2, 200


def _rdp(event, count=1, relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE):
  acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
  acc.compose(event, count)
  return acc.get_epsilon(DELTA)


def test_each_mechanisms_curve_is_its_dp_accounting_epsilon_for_a_run_of_that_length():
  found = {c.mechanism: c for c in planner.curves(
      total_rounds=120, population=N, delta=DELTA, noise_multipliers=[Z], cohort_sizes=[M],
      bands=10)}
  assert set(found) == set(planner.MECHANISMS)
  gaussian = dp_accounting.GaussianDpEvent(Z)
  for t, eps in zip(found['gaussian'].rounds, found['gaussian'].epsilons):
    assert eps == pytest.approx(_rdp(dp_accounting.PoissonSampledDpEvent(M / N, gaussian), t),
                                rel=1e-6)
  # The tree: epochs of N // M = 50 rounds, one tree each, replace-special.
  tree = found['tree']
  for t, eps in zip(tree.rounds, tree.epsilons):
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    for start in range(0, t, 50):
      acc.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(Z, min(50, t - start)))
    assert eps == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)
  assert list(found['correlated'].epsilons) == pytest.approx(
      [_rdp(gaussian)] * len(found['correlated'].rounds), rel=1e-9)
  # Amplified BandMF over 10 groups: q = 200 x 10 / 10000, ceil(t / 10) cycles.
  for t, eps in zip(found['amplified_bandmf'].rounds, found['amplified_bandmf'].epsilons):
    assert eps == pytest.approx(_rdp(dp_accounting.PoissonSampledDpEvent(0.2, gaussian),
                                     math.ceil(t / 10)), rel=1e-6)
  assert found['gaussian'].rounds[0] == 1 and found['gaussian'].rounds[-1] == 120


def _plan(args, cwd):
  return subprocess.run([sys.executable, '-m', 'tff_dp.accounting', '--plan'] + args, cwd=cwd,
                        env=script_env(), capture_output=True, text=True, timeout=300)


def test_the_command_prints_the_table_and_draws_the_picture(tmp_path):
  out = _plan(['--rounds=300', f'--population={N}', f'--delta={DELTA}', '--target_epsilon=3',
               '--plan_noise_multipliers=0.8,1.5', '--plan_cohorts=100,400',
               f'--plan_output={tmp_path / "plan.png"}'], REPO)
  assert out.returncode == 0, out.stderr[-2000:]
  header, *rows = out.stdout.strip().split('\n')
  assert header.split(',') == ['mechanism', 'noise_multiplier', 'clients_per_round',
                               'epsilon_rdp_after_300', 'rounds_within_epsilon_3']
  assert len(rows) == 3 * 2 * 2   # No --bands: no amplified BandMF.
  by_key = {tuple(r.split(',')[:3]): r.split(',') for r in rows}
  gaussian = by_key[('gaussian', '1.5', '100')]
  expected = _rdp(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.5)),
                  300)
  assert float(gaussian[3]) == pytest.approx(expected, rel=1e-5)
  assert expected < 3 and int(gaussian[4]) == 300   # Within the target all the way.
  tree = by_key[('tree', '0.8', '400')]   # Per-node z 0.8 without amplification: above 3.
  assert float(tree[3]) > 3 and int(tree[4]) == 0
  with open(tmp_path / 'plan.png', 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('args, message', [
    (['--rounds=10', f'--population={N}', f'--delta={DELTA}'], '--plan needs'),
    (['--rounds=10', f'--population={N}', f'--delta={DELTA}', '--plan_noise_multipliers=1',
      '--plan_cohorts=20000'], 'cohort size 20000'),
    (['--rounds=10', f'--population={N}', '--delta=0.5', '--plan_noise_multipliers=1',
      '--clients_per_round=10'], 'delta'),
    (['--rounds=10', f'--population={N}', f'--delta={DELTA}', '--plan_noise_multipliers=x',
      '--clients_per_round=10'], 'comma-separated list of numbers'),
    (['--rounds=10', f'--population={N}', f'--delta={DELTA}', '--plan_noise_multipliers=1',
      '--clients_per_round=10', '--plan_mechanisms=amplified_bandmf'], 'needs --bands'),
])
def test_bad_plans_are_refused_before_anything_is_written(args, message, tmp_path):
  out = _plan(args + ['--plan_output=plan.png'], tmp_path)
  assert out.returncode == 2 and message in out.stderr, out.stderr[-2000:]
  assert out.stderr.strip().startswith('error:')
  assert os.listdir(tmp_path) == []


def _kept_figures(monkeypatch) -> list:
  """The planner's figures, in the order drawn, kept to read."""
  from tff_dp.accounting import plan_plot  # pylint: disable=g-import-not-at-top
  drawn = []

  class Kept(plan_plot.Figure):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      drawn.append(self)
  monkeypatch.setattr(plan_plot, 'Figure', Kept)
  return drawn


def test_each_panel_is_named_as_the_tables_rows_name_its_mechanism(tmp_path, monkeypatch):
  from tff_dp.accounting import plan_plot  # pylint: disable=g-import-not-at-top
  drawn = _kept_figures(monkeypatch)
  curves = [planner.Curve(m, 1.0, 10, (1, 10), (0.5, 1.5))
            for m in ('gaussian', 'correlated')]
  plan_plot.draw(curves, str(tmp_path / 'p.png'), delta=DELTA, population=N,
                 descriptions=planner.MECHANISMS)
  titles = [ax.get_title() for ax in drawn[0].axes if ax.get_visible() and ax.lines]
  # The CSV says 'correlated': the panel said only "blt / bandmf ..." (issue 37.10).
  assert [t.split(':')[0] for t in titles] == ['gaussian', 'correlated'], titles


def test_the_correlated_panel_draws_each_z_once_and_says_what_its_z_is(tmp_path, monkeypatch):
  """Issue 51, item 6: the panel drew a line per cohort size, all on top of each other, with no
  word that its z is not DP-FedAvg's per-round z."""
  from tff_dp.accounting import plan_plot  # pylint: disable=g-import-not-at-top
  drawn = _kept_figures(monkeypatch)
  found = planner.curves(mechanisms=['gaussian', 'correlated'], noise_multipliers=[0.8, 1.5],
                         cohort_sizes=[100, 500], population=N, total_rounds=50, delta=DELTA)
  plan_plot.draw(found, str(tmp_path / 'p.png'), delta=DELTA, population=N,
                 notes=planner.Z_MEANS)
  gaussian, correlated = [ax for ax in drawn[0].axes if ax.get_visible()]
  assert len(gaussian.lines) == 4 and not gaussian.texts
  assert [line.get_label() for line in correlated.lines] == [
      'z = 0.8, any clients/round (same curve)', 'z = 1.5, any clients/round (same curve)']
  assert 'not a per-round z' in correlated.texts[0].get_text()
