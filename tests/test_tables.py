"""tff_dp.tables: run directories -> Markdown beside the paper's numbers, plots, CLI errors."""

import csv
import dataclasses
import json
import os

import dp_accounting
import numpy as np
import pytest

from tff_dp import ledger as ledger_lib
from tff_dp import tables
from tff_dp.tables import __main__ as tables_cli
from run_helpers import kept_figures
from tff_dp.tables import plots

_Q, _Z, _ROUNDS = 0.01, 1.2, 50


def _write_run(path, *, paper=None, dp='fixed', rounds=_ROUNDS, ema=False, clip_cols=1):
  os.makedirs(path)
  config = dict(dp=dp, total_rounds=rounds, clients_per_round=10, population_size=1000,
                delta_used=1e-4, paper_table=(paper or {}).get('table', ''),
                paper_arm=(paper or {}).get('arm', ''),
                paper_results=(paper or {}).get('results', {}))
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(config, f)
  cols = ['round', 'train_loss'] + [f'aggregator/g{i}/l2_norm_clip' for i in range(clip_cols)]
  cols += ['eval_accuracy'] + (['eval_ema_accuracy'] if ema else [])
  with open(os.path.join(path, 'metrics.csv'), 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=cols, restval='')
    w.writeheader()
    for r in range(1, rounds + 1):
      row = {'round': r, 'train_loss': 1.0 / r}
      row.update({f'aggregator/g{i}/l2_norm_clip': 0.5 + 0.01 * r + i for i in range(clip_cols)})
      if r % 10 == 0:   # Evaluated every 10 rounds.
        row['eval_accuracy'] = r / 100
        if ema:
          row['eval_ema_accuracy'] = r / 100 + 0.05
      w.writerow(row)
  if dp != 'none':
    with ledger_lib.PrivacyLedger(os.path.join(path, 'ledger.jsonl')) as led:
      for r in range(1, rounds + 1):
        led.append(ledger_lib.RoundRecord(
            r, ledger_lib.SamplingEvent('poisson', 1000, probability=_Q),
            (ledger_lib.GaussianSumQuery('update', 2.0, 2.0 * _Z),)))


def _rdp_epsilon(rounds, delta):
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(_Q, dp_accounting.GaussianDpEvent(_Z)), rounds)
  return acc.get_epsilon(delta)


def test_read_run_replays_ledger_at_papers_delta(tmp_path):
  run = tmp_path / 'adaptive'
  _write_run(str(run), paper={'table': 'T1', 'arm': 'adaptive',
                              'results': {'accuracy': 0.6, 'epsilon': 3.0, 'delta': 1e-6}})
  r = tables.read_run(str(run))
  assert r.delta == 1e-6                      # The paper's delta, not the run's 1e-4.
  # RDP accounting is exact (no rounding of z): dp_accounting's value to float precision.
  assert r.epsilon == pytest.approx(_rdp_epsilon(_ROUNDS, 1e-6), rel=1e-9)
  assert r.epsilon > _rdp_epsilon(_ROUNDS, 1e-4)
  assert [e for _, e in r.epsilon_curve][9] == pytest.approx(_rdp_epsilon(10, 1e-6), rel=1e-9)
  assert r.final_eval == {'accuracy': 0.5} and r.final_eval_round == 50
  assert r.rounds_completed == 50 and r.label == 'adaptive'
  # An explicit delta overrides the paper's.
  assert tables.read_run(str(run), delta=1e-4).epsilon == pytest.approx(
      _rdp_epsilon(_ROUNDS, 1e-4), rel=1e-9)


def test_build_tables_markdown_and_plots(tmp_path):
  paper_a = {'table': 'Shejwalkar et al. Table 1', 'arm': 'z=1.2',
             'results': {'accuracy': 0.2, 'ema_accuracy': 0.25, 'delta': 1e-5}}
  _write_run(str(tmp_path / 'runs' / 'a'), paper=paper_a, ema=True)
  _write_run(str(tmp_path / 'runs' / 'b'), paper=dict(paper_a, arm='per-layer'), clip_cols=3,
             rounds=30)
  _write_run(str(tmp_path / 'runs' / 'plain'), dp='none', rounds=20)
  out = tables.build_tables([str(tmp_path / 'runs' / n) for n in ('a', 'b', 'plain')],
                            str(tmp_path / 'out'))
  text = open(out['table']).read()
  lines = [l for l in text.splitlines() if l.startswith('| `')]
  assert len(lines) == 3
  cells = [c.strip() for c in lines[0].strip('|').split('|')]
  # run, arm, seed, clients(pop), rounds, paper rounds, delta, eps, paper eps, acc, paper acc,
  # ema, paper ema
  assert cells[:7] == ['`a`', 'z=1.2', '–', '10 (1000)', '50', '–', '1e-05']   # Seed: none.
  assert float(cells[7]) == pytest.approx(_rdp_epsilon(50, 1e-5), rel=1e-3)
  assert cells[9:] == ['0.5', '0.2', '0.55', '0.25']
  cells_b = [c.strip() for c in lines[1].strip('|').split('|')]
  assert cells_b[4] == '30' and cells_b[11:] == ['–', '0.25']   # b has no EMA column.
  assert float(cells_b[7]) == pytest.approx(_rdp_epsilon(30, 1e-5), rel=1e-3)
  plain = [c.strip() for c in lines[2].strip('|').split('|')]
  assert plain[7] == '∞' and plain[1] == '–'
  assert 'mean ± sd' not in text                # Three different arms: nothing to average.
  assert 'Runs without a paper reference' in text
  names = sorted(os.path.basename(p) for p in out['plots'])
  assert 'shejwalkar_et_al_table_1_clip_vs_round.png' in names
  assert len(names) == 8 and all(os.path.getsize(p) > 1000 for p in out['plots'])
  for p in out['plots']:
    assert f'({os.path.basename(p)})' in text


def test_tables_of_one_paper_keep_their_own_plots(tmp_path):
  """Two paper tables whose titles agree in their first 100 characters (the Recycling Scraps
  table and its DP-FedAvg companion share 57): each gets its four plots, named after it."""
  common = 'Shejwalkar et al. 2022 (Recycling Scraps): StackOverflow NWP, ' * 2
  titles = (common + 'over DP-FTRL', common + 'at epsilon 8.2')
  for name, title in zip('ab', titles):
    _write_run(str(tmp_path / 'runs' / name), paper={'table': title, 'arm': name})
  out = tables.build_tables([str(tmp_path / 'runs' / n) for n in 'ab'], str(tmp_path / 'out'))
  names = {os.path.basename(p) for p in out['plots']}
  assert len(names) == 8 and set(os.listdir(tmp_path / 'out')) == names | {'results.md'}
  prefixes = {n[:-len('_accuracy_vs_round.png')] for n in names
              if n.endswith('_accuracy_vs_round.png')}
  assert len(prefixes) == 2 and all(len(p) <= 100 for p in prefixes)
  # A title that fits is its words, whole.
  assert plots.slug('Shejwalkar et al. 2022 (Recycling Scraps): StackOverflow NWP over '
                    'DP-FTRL') == ('shejwalkar_et_al_2022_recycling_scraps_stackoverflow_nwp_'
                                   'over_dp_ftrl')


def test_cli_writes_table_and_rejects_bad_input(tmp_path, capsys):
  _write_run(str(tmp_path / 'r1'), paper={'table': 'T', 'arm': 'x', 'results': {'accuracy': 1}})
  _write_run(str(tmp_path / 'r2'))
  out = tmp_path / 'out'
  assert tables_cli.main(['prog', '--runs', str(tmp_path / 'r1'), str(tmp_path / 'r2'),
                          f'--output_dir={out}']) == 0
  assert (out / 'results.md').read_text().count('| `r') == 2
  assert tables_cli.main(['prog', '--runs', str(tmp_path / 'nope')]) == 2
  assert 'not a run directory' in capsys.readouterr().err
  assert tables_cli.main(['prog', '--runs', str(tmp_path / 'r1'), '--delta=2']) == 2
  assert 'delta' in capsys.readouterr().err
  assert tables_cli.main(['prog']) == 2


def _write_library_run(root, name, *, seed, accuracies, clip=1.0, arm='fixed clip'):
  """A finished run written by the library's own writers (RunDirectory, PrivacyLedger), with
  the config.json run_experiment.py writes: evaluated every round, `accuracies` in order."""
  from tff_dp.training import config as config_lib  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from tff_dp.training.run_state import run_dir as run_dir_lib
  rounds = len(accuracies)
  cfg = config_lib.ExperimentConfig.from_settings(
      root_output_dir=str(root), experiment_name=name, seed=seed, total_rounds=rounds,
      clients_per_round=10, dp='fixed', clip=clip, noise_multiplier=_Z, delta=1e-5,
      paper_table='Seeds table', paper_arm=arm)
  run = run_dir_lib.RunDirectory(str(root), name, resume=False)
  run.create()
  run.write_config(dict(cfg.settings(), delta_used=1e-5, population_size=1000))
  with ledger_lib.PrivacyLedger(run.file('ledger.jsonl')) as led:
    for r, acc in enumerate(accuracies, 1):
      led.append(ledger_lib.RoundRecord(
          r, ledger_lib.SamplingEvent('poisson', 1000, probability=_Q),
          (ledger_lib.GaussianSumQuery('update', clip, clip * _Z),)))
      run.metrics.append({'round': r, 'train_loss': 1.0 / r, 'eval_accuracy': acc,
                          'aggregator/l2_norm_clip': clip})
  run.write_json('summary.json', {'rounds_completed': rounds})
  return run.path


def _md_rows(text):
  return [[c.strip() for c in line.strip().strip('|').split('|')]
          for line in text.splitlines() if line.startswith('| ') and not line.startswith('| run')]


def test_seeds_of_one_arm_are_shown_each_and_summarised(tmp_path, monkeypatch):
  """Two runs of one arm with seeds 0 and 1 (given out of order, with another arm between):
  one row per seed, then mean ± sd over them; the other arm is not pooled with them."""
  acc0, acc1 = [0.2, 0.4, 0.61], [0.25, 0.45, 0.58]
  seed1 = _write_library_run(tmp_path, 'fixed+seed=1+abc', seed=1, accuracies=acc1)
  other = _write_library_run(tmp_path, 'fixed_half', seed=2, accuracies=[0.1, 0.2, 0.3],
                             clip=0.5, arm='fixed clip 0.5')
  seed0 = _write_library_run(tmp_path, 'fixed', seed=0, accuracies=acc0)
  figures = kept_figures(monkeypatch)
  out = tmp_path / 'out'
  assert tables_cli.main(['prog', '--runs', seed1, other, seed0, f'--output_dir={out}']) == 0
  text = (out / 'results.md').read_text()
  rows = _md_rows(text)
  # run, arm, seed, clients (pop.), rounds, paper rounds, delta, epsilon, paper eps, acc, paper acc
  assert [r[:3] for r in rows] == [['`fixed`', 'fixed clip', '0'],
                                   ['`fixed+seed=1+abc`', 'fixed clip', '1'],
                                   ['mean ± sd (2 runs)', 'fixed clip', '0, 1'],
                                   ['`fixed_half`', 'fixed clip 0.5', '2']]
  finals = [acc0[-1], acc1[-1]]   # Each run's last evaluation.
  assert [float(rows[0][9]), float(rows[1][9])] == finals
  mean, sd = (float(x) for x in rows[2][9].split(' ± '))
  assert mean == pytest.approx(np.mean(finals), rel=1e-3)
  assert sd == pytest.approx(np.std(finals, ddof=1), rel=1e-3)
  eps_mean, eps_sd = (float(x) for x in rows[2][7].split(' ± '))
  assert eps_mean == pytest.approx(_rdp_epsilon(3, 1e-5), rel=1e-3) and eps_sd == 0
  assert rows[2][4] == '3 ± 0' and text.count('mean ± sd (') == 1
  # Plots: one line per seed, told apart by the seed; the other arm keeps its own name.
  legends = {}
  for fig in figures:
    ax = fig.axes[0]
    legends[ax.get_title()] = sorted(t.get_text() for t in ax.get_legend().get_texts())
  assert legends['Accuracy vs round'] == ['fixed clip (seed 0)', 'fixed clip (seed 1)',
                                          'fixed clip 0.5']
  assert legends['Clip norm vs round'] == legends['Accuracy vs round']


def test_cli_help_lists_the_flags_and_paths_expand_the_home_directory(tmp_path, capsys,
                                                                      monkeypatch):
  assert tables_cli.main(['prog', '--help']) == 0
  out = capsys.readouterr().out
  assert 'python -m tff_dp.tables' in out and all(f'--{f}' in out for f in
                                                   ('runs', 'output_dir', 'delta', 'method'))
  monkeypatch.setenv('HOME', str(tmp_path))
  _write_run(str(tmp_path / 'r1'))
  assert tables_cli.main(['prog', '--runs', '~/r1', '--output_dir=~/out']) == 0
  assert (tmp_path / 'out' / 'results.md').exists()


def test_table_plots_name_delta_and_accountant_on_epsilon_axes(tmp_path, monkeypatch):
  _write_run(str(tmp_path / 'r1'))
  figures = kept_figures(monkeypatch)
  out = tables.build_tables([str(tmp_path / 'r1')], str(tmp_path / 'out'), method='pld')
  axes = {os.path.basename(p): f.axes[0] for p, f in zip(out['plots'], figures)}
  delta = out['results'][0].delta
  label = f'epsilon at delta = {delta:.3g}\n(PLD accountant)'
  assert [a.get_ylabel() for n, a in axes.items() if n.endswith('epsilon_vs_round.png')] == [label]
  assert [a.get_xlabel() for n, a in axes.items() if n.endswith('accuracy_vs_epsilon.png')] == [
      label]
