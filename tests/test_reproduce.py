"""experiments/ flag files and reproduce.py: every table parses, runs at smoke scale, tabulates."""

import glob
import json
import math
import os
import subprocess
import sys

import dp_accounting
import pytest

from tff_dp import ledger as ledger_lib
from tff_dp import runtime
from run_helpers import metrics_rows
from run_helpers import REPO
from run_helpers import script
from run_helpers import script_env

EXPERIMENTS = os.path.join(REPO, 'experiments')
TABLES = sorted(d for d in os.listdir(EXPERIMENTS) if os.path.isdir(os.path.join(EXPERIMENTS, d)))
ARMS = sorted(p for p in glob.glob(os.path.join(EXPERIMENTS, '*', '*.flags'))
              if not p.endswith('smoke.flags'))


def _reproduce(args, timeout=1800):
  return subprocess.run(script('reproduce.py') + args, env=script_env(),
                        capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope='module')
def cli_flags():
  sys.path.insert(0, REPO)
  import run_experiment  # pylint: disable=g-import-not-at-top
  yield run_experiment
  run_experiment.flags.FLAGS.unparse_flags()


def test_the_four_paper_tables_are_there():
  assert TABLES == ['andrew2021_emnist', 'andrew2021_stackoverflow_nwp',
                    'li2022_adadps_stackoverflow_tag', 'shejwalkar2022_recycling_stackoverflow_nwp']
  for table in TABLES:
    assert os.path.isfile(os.path.join(EXPERIMENTS, table, 'smoke.flags'))


@pytest.mark.parametrize('scale', ['full', 'smoke'])
@pytest.mark.parametrize('arm', ARMS, ids=lambda p: os.path.relpath(p, EXPERIMENTS))
def test_every_arm_parses_into_a_valid_config(arm, scale, cli_flags):
  flags = cli_flags.flags.FLAGS
  flags.unparse_flags()
  argv = ['prog', f'--flagfile={arm}']
  if scale == 'smoke':
    argv.append(f'--flagfile={os.path.join(os.path.dirname(arm), "smoke.flags")}')
  flags(argv)
  cfg = cli_flags._config()  # pylint: disable=protected-access
  cfg.validate()
  assert cfg.paper_table and cfg.paper_arm   # Every arm cites its table and row.
  assert cfg.dp != 'none' and cfg.noise_multiplier > 0 and cfg.delta is not None
  with open(arm) as f:
    assert f.readline().startswith('# ')      # ...and the paper, in a header comment.
  if scale == 'full':
    assert cfg.total_rounds >= 200 and cfg.clients_per_round >= 20
  else:
    assert cfg.total_rounds <= 6 and cfg.clients_per_round <= 10
  if 'recycling' in arm:
    assert cfg.paper_results['epsilon'] == 8.2 and 0.2 < cfg.paper_results['accuracy'] < 0.25
    assert cfg.ema_beta and cfg.past_k
  if 'adadps' in arm:
    assert cfg.max_train_clients == (400 if scale == 'full' else 40)
    assert (cfg.precondition == 'client') == arm.endswith('adadps.flags')


def test_recycling_noise_is_calibrated_to_the_papers_epsilon(cli_flags):
  """The full-scale z in the flag file gives epsilon 8.2 (the paper's) under our accounting."""
  from tff_dp.accounting import calibration  # pylint: disable=g-import-not-at-top
  flags = cli_flags.flags.FLAGS
  flags.unparse_flags()
  flags(['prog', f'--flagfile={os.path.join(EXPERIMENTS, TABLES[3], "last_iterate.flags")}'])
  cfg = cli_flags._config()  # pylint: disable=protected-access
  q = cfg.clients_per_round / 342477
  sigma_b = cfg.clipped_count_stddev
  # Eq. (1) of the ledger paper: update-query z_u from z and sigma_b (clip of the count: 1/2).
  z_u = (cfg.noise_multiplier**-2 - (2 * sigma_b)**-2)**-0.5
  event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.ComposedDpEvent(
      [dp_accounting.GaussianDpEvent(z_u), dp_accounting.GaussianDpEvent(2 * sigma_b)]))
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(event, cfg.total_rounds)
  assert acc.get_epsilon(cfg.delta) == pytest.approx(8.2, abs=0.02)
  del calibration


def test_dry_run_and_bad_input(tmp_path):
  out = _reproduce(['--table=li2022_adadps_stackoverflow_tag', '--scale=smoke', '--dry_run',
                    f'--root_output_dir={tmp_path}'])
  assert out.returncode == 0, out.stderr
  commands = [l for l in out.stdout.splitlines() if 'run_experiment.py' in l]
  assert len(commands) == 2 and all('smoke.flags' in c for c in commands)
  assert not os.path.exists(tmp_path / 'li2022_adadps_stackoverflow_tag-smoke' / 'results.md')
  full = _reproduce(['--table=andrew2021_emnist', '--scale=full', '--dry_run',
                     f'--data_dir={tmp_path}', f'--root_output_dir={tmp_path}'])
  assert full.returncode == 0 and f'--data_dir={tmp_path}' in full.stdout
  assert 'smoke.flags' not in full.stdout
  for args, message in [(['--table=nope'], 'unknown --table'),
                        ([], '--table is required'),
                        (['--table=andrew2021_emnist', '--scale=full',
                          '--data_dir=/nonexistent/tff'], 'load_data'),
                        (['--table=andrew2021_emnist', '--arms=nope'], 'unknown --arms')]:
    bad = _reproduce(args + [f'--root_output_dir={tmp_path}'])
    assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)


def _table_rows(path):
  rows = {}
  with open(path) as f:
    for line in f:
      if line.startswith('| `'):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        rows[cells[0].strip('`')] = cells
  return rows


def _independent_epsilon(run_dir, delta):
  """Epsilon from the ledger through dp_accounting directly (no tff_dp accountant)."""
  acc = dp_accounting.rdp.RdpAccountant()
  for record in ledger_lib.read_ledger(os.path.join(run_dir, 'ledger.jsonl')):
    inner = dp_accounting.ComposedDpEvent([
        dp_accounting.GaussianDpEvent(float(q.noise_stddev) / float(q.l2_norm_clip))
        for q in record.queries])
    s = record.sampling
    q = s.probability if s.kind == 'poisson' else s.sample_size / s.population_size
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, inner))
  return acc.get_epsilon(delta)


@pytest.mark.slow
def test_every_table_reproduces_at_smoke_scale(tmp_path):
  out = _reproduce(['--table=all', '--scale=smoke', f'--root_output_dir={tmp_path}'])
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  for table in TABLES:
    table_dir = tmp_path / f'{table}-smoke'
    rows = _table_rows(table_dir / 'results.md')
    arms = sorted(os.path.basename(p)[:-len('.flags')]
                  for p in glob.glob(os.path.join(EXPERIMENTS, table, '*.flags'))
                  if not p.endswith('smoke.flags'))
    assert sorted(rows) == arms
    assert len(glob.glob(str(table_dir / '*.png'))) == 4
    for arm, cells in rows.items():
      run_dir = table_dir / 'runs' / arm
      config = json.loads((run_dir / 'config.json').read_text())
      metrics = metrics_rows(run_dir)
      assert int(cells[3]) == config['total_rounds'] == len(metrics)
      if 'adadps' in table:   # --max_train_clients: the population is the subset.
        assert config['population_size'] == 40 and cells[2] == '8 (40)'
      final_acc = [float(m['eval_accuracy']) for m in metrics if m.get('eval_accuracy')][-1]
      assert float(cells[8]) == pytest.approx(final_acc, rel=1e-3)
      delta = config['paper_results'].get('delta', config['delta_used'])
      assert float(cells[6]) == pytest.approx(_independent_epsilon(str(run_dir), delta),
                                              rel=1e-3)
      assert math.isfinite(float(cells[6])) and float(cells[6]) > 0
  recycling = tmp_path / f'{TABLES[3]}-smoke' / 'runs'
  for arm in ('last_iterate', 'train_on_ema'):
    last = metrics_rows(recycling / arm)[-1]
    assert last['eval_ema_accuracy'] and last['eval_past_k_accuracy']
    assert (recycling / arm / 'uncertainty.json').exists()
  # Same sampling and noise: training over the EMA leaves the privacy ledger's epsilon unchanged.
  eps = {arm: _table_rows(tmp_path / f'{TABLES[3]}-smoke' / 'results.md')[arm][6]
         for arm in ('last_iterate', 'train_on_ema')}
  assert eps['last_iterate'] == eps['train_on_ema']
  # A second invocation finds every arm complete and only rebuilds the tables.
  again = _reproduce(['--table=all', '--scale=smoke', f'--root_output_dir={tmp_path}'],
                     timeout=300)
  assert again.returncode == 0 and again.stdout.count('complete, skipped') == sum(
      len(_table_rows(tmp_path / f'{t}-smoke' / 'results.md')) for t in TABLES)
  assert not runtime.orphaned_worker_pids()   # Every arm's process stopped its worker.
