"""experiments/ flag files and reproduce.py: every table parses, runs at smoke scale, tabulates."""

import glob
import json
import math
import os
import re
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest

from tff_dp import ledger as ledger_lib
from tff_dp.execution import runtime
from tff_dp.training import config_flags
from run_helpers import metrics_rows
from run_helpers import REPO
from run_helpers import script
from run_helpers import script_env
from run_helpers import tagged_env
from run_helpers import tagged_workers
from test_matrix_factorization import _brute_force_sensitivity

EXPERIMENTS = os.path.join(REPO, 'experiments')
TABLES = sorted(d for d in os.listdir(EXPERIMENTS) if os.path.isdir(os.path.join(EXPERIMENTS, d)))
_RECYCLING = 'shejwalkar2022_recycling_stackoverflow_nwp'
ARMS = sorted(p for p in glob.glob(os.path.join(EXPERIMENTS, '*', '*.flags'))
              if not p.endswith('smoke.flags'))


def _reproduce(args, timeout=1800, env=None):
  return subprocess.run(script('reproduce.py') + args, env=env or script_env(),
                        capture_output=True, text=True, timeout=timeout)


def _arm_config(arm_file, scale, extra=()):
  """The config run_experiment.py runs for the arm's flag files (plus `extra` flags)."""
  argv = [f'--flagfile={arm_file}']
  if scale == 'smoke':
    argv.append(f'--flagfile={os.path.join(os.path.dirname(arm_file), "smoke.flags")}')
  return config_flags.parse(argv + list(extra))


def test_every_table_has_smoke_flags():
  assert TABLES   # The listing found the experiments (not an empty directory that passes).
  for table in TABLES:
    assert os.path.isfile(os.path.join(EXPERIMENTS, table, 'smoke.flags'))


@pytest.mark.parametrize('scale', ['full', 'smoke'])
@pytest.mark.parametrize('arm', ARMS, ids=lambda p: os.path.relpath(p, EXPERIMENTS))
def test_every_arm_parses_into_a_valid_config(arm, scale):
  cfg = _arm_config(arm, scale)   # Checked when built.
  assert cfg.paper.paper_table and cfg.paper.paper_arm   # Every arm cites its table and row.
  assert cfg.dp.kind != 'none' and cfg.dp.noise_multiplier > 0
  assert cfg.accounting.delta is not None
  with open(arm) as f:
    assert f.readline().startswith('# ')      # ...and the paper, in a header comment.
  if scale == 'full':
    assert cfg.training.total_rounds >= 200 and cfg.sampling.clients_per_round >= 20
  else:
    assert cfg.training.total_rounds <= 6 and cfg.sampling.clients_per_round <= 10
  if 'recycling' in arm:
    paper = cfg.paper.paper_results
    assert paper['epsilon'] in (8.2, 18.9) and 0.2 < paper['accuracy'] < 0.25
    assert cfg.checkpoint_aggregation.ema_beta and cfg.checkpoint_aggregation.past_k
  if 'adadps' in arm:
    assert cfg.task.max_train_clients == (400 if scale == 'full' else 40)
    assert (cfg.adadps.precondition == 'client') == arm.endswith('adadps.flags')


def test_recycling_noise_is_calibrated_to_the_papers_epsilon():
  """The full-scale z in the flag file gives epsilon 8.2 (the paper's) under our accounting."""
  cfg = _arm_config(os.path.join(EXPERIMENTS, _RECYCLING, 'last_iterate.flags'), 'full')
  q = cfg.sampling.clients_per_round / 342477
  sigma_b = cfg.dp.clipped_count_stddev
  # Eq. (1) of the ledger paper: update-query z_u from z and sigma_b (clip of the count: 1/2).
  z_u = (cfg.dp.noise_multiplier**-2 - (2 * sigma_b)**-2)**-0.5
  event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.ComposedDpEvent(
      [dp_accounting.GaussianDpEvent(z_u), dp_accounting.GaussianDpEvent(2 * sigma_b)]))
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(event, cfg.training.total_rounds)
  assert acc.get_epsilon(cfg.accounting.delta) == pytest.approx(8.2, abs=0.02)


@pytest.mark.parametrize('arm', [a for a in ARMS if os.path.basename(a).startswith('ftrl_')],
                         ids=os.path.basename)
def test_ftrl_noise_is_calibrated_to_the_papers_epsilon(arm):
  """The DP-FTRL arms' per-node z gives the paper's epsilon (8.2 or 18.9) for one tree of 1600
  steps (one epoch of shuffled participation: 342,477 // 100 rounds > 1600), computed with
  dp_accounting's tree event under replace-special neighbouring."""
  cfg = _arm_config(arm, 'full')
  assert cfg.dp.kind == 'ftrl' and cfg.sampling.client_sampling == 'shuffled'
  rounds = cfg.training.total_rounds
  assert rounds <= 342477 // cfg.sampling.clients_per_round
  acc = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
  acc.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(cfg.dp.noise_multiplier, rounds))
  assert acc.get_epsilon(cfg.accounting.delta) == pytest.approx(
      cfg.paper.paper_results['epsilon'], abs=0.02)


_POPULATION = {'dpftrl_mechanisms_emnist': 3400, 'dpftrl_mechanisms_stackoverflow_nwp': 342477}


@pytest.mark.parametrize('arm', [a for a in ARMS if os.path.basename(os.path.dirname(a))
                                 in _POPULATION], ids=lambda p: os.path.relpath(p, EXPERIMENTS))
def test_dpftrl_mechanism_arms_are_calibrated_to_the_tables_epsilon(arm):
  """Each mechanism's z meets the table's epsilon under that mechanism's analysis, built here
  with dp_accounting: Poisson-sampled Gaussians (DP-FedAvg), one tree per epoch of shuffled
  participation (the tree), one Gaussian (blt, bandmf under min separation: z does not depend
  on the strategy), ceil(n / bands) Poisson-sampled Gaussians (amplified BandMF)."""
  cfg = _arm_config(arm, 'full')
  n, m, z = cfg.training.total_rounds, cfg.sampling.clients_per_round, cfg.dp.noise_multiplier
  population = _POPULATION[os.path.basename(os.path.dirname(arm))]
  sampled = lambda q: dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
  acc = dp_accounting.rdp.RdpAccountant()
  if cfg.dp.kind == 'fixed':
    acc.compose(sampled(m / population), n)
  elif cfg.dp.kind == 'ftrl':
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    epoch = population // m
    for start in range(0, n, epoch):
      acc.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(z, min(epoch, n - start)))
  elif cfg.sampling.client_sampling == 'cyclic_poisson':
    bands = cfg.mechanism_settings()['bands']
    acc.compose(sampled(m * bands / population), math.ceil(n / bands))
  else:
    assert cfg.sampling.client_sampling == 'min_separation'
    acc.compose(dp_accounting.GaussianDpEvent(z))
  target = cfg.paper.paper_results['epsilon']
  assert target - 0.01 < acc.get_epsilon(cfg.accounting.delta) <= target


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
                        (['--table=andrew2021_emnist', '--arms=nope'], 'unknown --arms'),
                        (['--bogus_flag'], "error: Unknown command line flag 'bogus_flag'"),
                        # Every arm's config is checked before the first arm runs.
                        (['--table=andrew2021_emnist', '--extra_flags=--clip=-1'],
                         '--clip must be positive, got -1.0')]:
    bad = _reproduce(args + [f'--root_output_dir={tmp_path}'])
    assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)
    assert bad.stderr.count('error:') == 1 and not _planned(bad.stdout), bad.stderr
  assert os.listdir(tmp_path) == []   # Nothing of the refused commands was written.


# reproduce.py's `main` in a fresh interpreter, then whether TensorFlow was imported.
_PROBE = ('import sys, reproduce; code = reproduce.main(sys.argv); '
          'print("exit", code, "tensorflow" in sys.modules)')


@pytest.mark.parametrize('args, code', [(['--table=all', '--scale=smoke', '--dry_run'], 0),
                                        (['--table=nope'], 2)])
def test_planning_and_refusing_import_no_tensorflow(args, code, tmp_path):
  """reproduce.py starts no TFF worker (each arm is a run_experiment.py process that manages its
  own): planning every table, or refusing a flag, answers without TensorFlow's import."""
  out = subprocess.run([sys.executable, '-c', _PROBE, *args, f'--root_output_dir={tmp_path}'],
                       cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=120)
  last_line = out.stdout.strip().splitlines()[-1]
  assert last_line == f'exit {code} False', out.stdout[-2000:] + out.stderr[-2000:]


def _table_rows(path):
  rows = {}
  with open(path) as f:
    for line in f:
      if line.startswith('| `'):
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        rows[cells[0].strip('`')] = cells
  return rows


def _strategy_matrix(noise, n):
  """The n x n lower-triangular Toeplitz strategy a ledger records, built here: the BLT's
  coefficients 1, sum_i w_i t_i^(k-1), or the column-normalized banded square root."""
  if noise.mechanism == 'blt':
    coefs = [1.0] + [sum(w * t**(k - 1) for w, t in zip(noise.output_scale, noise.buf_decay))
                     for k in range(1, n)]
  else:
    root = np.array([math.comb(2 * k, k) / 4**k for k in range(min(noise.bands, n))])
    coefs = list(root / np.linalg.norm(root)) + [0.0] * (n - min(noise.bands, n))
  return np.array([[coefs[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


def _correlated_epsilon(records, delta):
  """Correlated noise: one Gaussian with multiplier sigma / (clip sens_t) under min
  separation, brute-force sensitivity; amplified BandMF: ceil(t / groups) Poisson-sampled
  Gaussians at one column's norm."""
  noise, s, t = records[0].correlated, records[-1].sampling, len(records)
  (query,) = records[0].queries
  ratio = float(query.noise_stddev) / float(query.l2_norm_clip)
  matrix = _strategy_matrix(noise, t)
  acc = dp_accounting.rdp.RdpAccountant()
  if s.kind == 'cyclic_poisson':
    column = float(np.linalg.norm(matrix[:, 0]))
    acc.compose(dp_accounting.PoissonSampledDpEvent(
        s.probability, dp_accounting.GaussianDpEvent(ratio / column)), math.ceil(t / s.groups))
  else:
    sens = _brute_force_sensitivity(matrix, noise.min_separation, noise.max_participations)
    acc.compose(dp_accounting.GaussianDpEvent(ratio / math.sqrt(sens)))
  return acc.get_epsilon(delta)


def _independent_epsilon(run_dir, delta):
  """Epsilon from the ledger through dp_accounting directly (no tff_dp accountant): the sampled
  Gaussian per round, or, for tree noise (DP-FTRL), one tree event per epoch of shuffled
  participation (a tree restarts where a record's tree_leaf is 1) under replace-special, or
  for correlated noise `_correlated_epsilon`."""
  records = ledger_lib.read_ledger(os.path.join(run_dir, 'ledger.jsonl'))
  if records and records[0].correlated is not None:
    return _correlated_epsilon(records, delta)
  if records and records[0].tree_leaf is not None:
    acc = dp_accounting.rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    trees_by_epoch = {}
    for record in records:
      trees = trees_by_epoch.setdefault(record.sampling.epoch, [])
      if record.tree_leaf == 1 or not trees:
        trees.append(0)
      trees[-1] += 1
    (query,) = records[0].queries
    z = float(query.noise_stddev) / float(query.l2_norm_clip)
    for trees in trees_by_epoch.values():
      acc.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(z, trees))
    return acc.get_epsilon(delta)
  acc = dp_accounting.rdp.RdpAccountant()
  for record in records:
    inner = dp_accounting.ComposedDpEvent([
        dp_accounting.GaussianDpEvent(float(q.noise_stddev) / float(q.l2_norm_clip))
        for q in record.queries])
    s = record.sampling
    q = s.probability if s.kind == 'poisson' else s.sample_size / s.population_size
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, inner))
  return acc.get_epsilon(delta)


# The default suite runs one arm per table (for the Recycling Scraps table, its two DP-FTRL arms at
# epsilon 8.2: its ledger check compares them); `make test-tables` runs every arm of every table
# (marker `all_tables`).
_ONE_ARM_PER_TABLE = {
    'andrew2021_emnist': ['adaptive'],
    'andrew2021_stackoverflow_nwp': ['adaptive'],
    'li2022_adadps_stackoverflow_tag': ['adadps'],
    # One arm: the pair's equal epsilon is checked in `make test-tables` and, in the library,
    # by test_experiment's checkpoint-aggregation test.
    _RECYCLING: ['ftrl_eps8.2_train_on_ema'],
    'dpftrl_mechanisms_emnist': ['blt'],
    'dpftrl_mechanisms_stackoverflow_nwp': ['bandmf_amplified_eps8.2'],
}


def _all_arms(table):
  return sorted(os.path.basename(p)[:-len('.flags')]
                for p in glob.glob(os.path.join(EXPERIMENTS, table, '*.flags'))
                if not p.endswith('smoke.flags'))


def _reproduce_smoke_tables(tmp_path, arms_by_table):
  """Runs reproduce.py at smoke scale for each table's arms (every arm: one `--table=all` call)
  and checks each table against its runs, an independent epsilon, and a second invocation."""
  env, tag = tagged_env()   # Only this test's workers are judged (run_helpers.tagged_workers).
  every_arm = all(arms == _all_arms(t) for t, arms in arms_by_table.items())
  calls = ([['--table=all']] if every_arm and sorted(arms_by_table) == TABLES else
           [[f'--table={t}', f'--arms={",".join(arms)}'] for t, arms in arms_by_table.items()])
  for args in calls:
    out = _reproduce(args + ['--scale=smoke', f'--root_output_dir={tmp_path}'], env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  for table, arms in arms_by_table.items():
    table_dir = tmp_path / f'{table}-smoke'
    rows = _table_rows(table_dir / 'results.md')
    assert sorted(rows) == sorted(arms)
    titles = set()   # The paper tables among the arms.
    for arm, cells in rows.items():
      run_dir = table_dir / 'runs' / arm
      config = json.loads((run_dir / 'config.json').read_text())
      titles.add(config['paper_table'])
      metrics = metrics_rows(run_dir)
      # run, arm, seed, clients (pop.), rounds, paper rounds, delta, epsilon, paper eps, acc
      assert int(cells[4]) == config['total_rounds'] == len(metrics)
      assert cells[2] == '0'   # The flag files set no --seed: run_experiment.py's default.
      if 'adadps' in table:   # --max_train_clients: the population is the subset.
        assert config['population_size'] == 40 and cells[3] == '8 (40)'
      final_acc = [float(m['eval_accuracy']) for m in metrics if m.get('eval_accuracy')][-1]
      assert float(cells[9]) == pytest.approx(final_acc, rel=1e-3)
      delta = config['paper_results'].get('delta', config['delta_used'])
      assert float(cells[7]) == pytest.approx(_independent_epsilon(str(run_dir), delta),
                                              rel=1e-3)
      assert math.isfinite(float(cells[7])) and float(cells[7]) > 0
    # Four plots per paper table (Recycling Scraps: its DP-FTRL table and the DP-FedAvg arms').
    assert len(glob.glob(str(table_dir / '*.png'))) == 4 * len(titles)
  # Every arm of the Recycling Scraps table evaluates its aggregates; in each (last iterate,
  # training over the EMA) pair, the same sampling and noise leave the ledger's epsilon unchanged.
  recycling_arms = arms_by_table.get(_RECYCLING, [])
  for arm in recycling_arms:
    run_dir = tmp_path / f'{_RECYCLING}-smoke' / 'runs' / arm
    last = metrics_rows(run_dir)[-1]
    assert last['eval_ema_accuracy'] and last['eval_past_k_accuracy']
    assert (run_dir / 'uncertainty.json').exists()
  pairs = [(a, a.replace('last_iterate', 'train_on_ema')) for a in recycling_arms
           if a.endswith('last_iterate') and
           a.replace('last_iterate', 'train_on_ema') in recycling_arms]
  assert pairs or recycling_arms != _all_arms(_RECYCLING)   # Every arm: the pairs are there.
  rows = _table_rows(tmp_path / f'{_RECYCLING}-smoke' / 'results.md') if pairs else {}
  for last_iterate, train_on_ema in pairs:
    assert rows[last_iterate][7] == rows[train_on_ema][7]
  # A second invocation finds every arm complete and only rebuilds the tables.
  for args in calls:
    again = _reproduce(args + ['--scale=smoke', f'--root_output_dir={tmp_path}'],
                       timeout=300, env=env)
    tables_run = arms_by_table if args == ['--table=all'] else [args[0].split('=', 1)[1]]
    assert again.returncode == 0 and again.stdout.count('complete, skipped') == sum(
        len(arms_by_table[t]) for t in tables_run)
  # Every arm's process stopped its worker.
  assert tagged_workers(tag) == set()


@pytest.fixture(scope='module')
def one_arm_per_table(tmp_path_factory):
  """ROOT of the default suite's smoke tables, reproduced and checked once (all of
  `_reproduce_smoke_tables`); the second-seed test builds on their finished EMNIST run."""
  root = tmp_path_factory.mktemp('one_arm_per_table')
  _reproduce_smoke_tables(root, _ONE_ARM_PER_TABLE)
  return root


@pytest.mark.slow
def test_one_arm_per_table_reproduces_at_smoke_scale(one_arm_per_table):
  # The checks ran in the fixture; here, that it covered every table.
  assert sorted(os.listdir(one_arm_per_table)) == sorted(
      f'{table}-smoke' for table in _ONE_ARM_PER_TABLE) == sorted(f'{t}-smoke' for t in TABLES)


@pytest.mark.slow
@pytest.mark.all_tables
def test_every_table_reproduces_at_smoke_scale(tmp_path):
  _reproduce_smoke_tables(tmp_path, {t: _all_arms(t) for t in TABLES})


def _finished_run(runs_dir, arm_file, name, extra=(), scale='smoke', data_dir=None):
  """A finished run of `arm_file` in RUNS_DIR/NAME, without training: the config.json
  run_experiment.py writes for the command line reproduce.py gives it (its flag parsing, the
  library's RunDirectory) and summary.json, which marks a run finished."""
  # pylint: disable-next=g-import-not-at-top
  from tff_dp.training.run_state import run_dir as run_dir_lib
  data = [] if scale == 'smoke' else [f'--data_dir={data_dir}']
  cfg = _arm_config(arm_file, scale, data + [f'--root_output_dir={runs_dir}',
                                             f'--experiment_name={name}'] + list(extra))
  run = run_dir_lib.RunDirectory(str(runs_dir), name, resume=False)
  run.create()
  run.write_config(dict(cfg.settings(), delta_used=cfg.accounting.delta, population_size=40))
  run.write_json('summary.json', {'rounds_completed': cfg.training.total_rounds})
  return run.path


def _planned(stdout):
  """{'TABLE/RUN_DIR_NAME': its run_experiment.py command} for each arm a dry run would run."""
  out = {}
  for line in stdout.splitlines():
    m = re.match(r'\[([^]]+)\] (\S+): (.*run_experiment\.py.*)$', line)
    if m:
      out[f'{m.group(1)}/{m.group(2)}'] = m.group(3).split()
  return out


@pytest.mark.parametrize('scale', ['smoke', 'full'])
@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_extra_flags_runs_are_new_runs_beside_the_finished_ones(tmp_path, scale):
  """After a seed-0 run of every arm, --extra_flags=--seed=1 runs every arm again in new
  directories (not 'complete, skipped'); --seed=2 in yet others; a finished --seed=1 run is
  then reused. Every arm's own finished run is recognised as matching its flag files."""
  runs = {p: tmp_path / f'{p.split(os.sep)[-2]}-{scale}' / 'runs' for p in ARMS}
  arm_of = {p: os.path.basename(p)[:-len('.flags')] for p in ARMS}
  for arm_file in ARMS:
    _finished_run(runs[arm_file], arm_file, arm_of[arm_file], scale=scale, data_dir=tmp_path)
  base = ['--table=all', f'--scale={scale}', '--dry_run', f'--root_output_dir={tmp_path}'] + (
      [f'--data_dir={tmp_path}'] if scale == 'full' else [])
  # The seed-0 runs match their flag files (config.json as run_experiment.py writes it).
  again = _reproduce(base)
  assert again.returncode == 0, again.stderr
  assert again.stdout.count('complete, skipped') == len(ARMS) and not _planned(again.stdout)

  seed1 = _reproduce(base + ['--extra_flags=--seed=1'])
  assert seed1.returncode == 0, seed1.stderr
  assert 'complete, skipped' not in seed1.stdout
  planned = _planned(seed1.stdout)
  assert len(planned) == len(ARMS)
  name_of = {}
  for arm_file in ARMS:
    [cmd] = [c for c in planned.values() if f'--flagfile={arm_file}' in c]
    name = cmd[cmd.index(f'--root_output_dir={runs[arm_file]}') + 1][len('--experiment_name='):]
    assert name.startswith(arm_of[arm_file] + '+') and 'seed=1' in name          # Readable,
    assert re.fullmatch(r'[A-Za-z0-9._=+-]+', name)                             # safe.
    assert cmd[-1] == '--seed=1' and '--resume' not in cmd
    name_of[arm_file] = name
  for arm_file in ARMS:   # A dry run creates nothing.
    assert sorted(os.listdir(runs[arm_file])) == sorted(
        arm_of[p] for p in ARMS if runs[p] == runs[arm_file])

  seed2 = _planned(_reproduce(base + ['--extra_flags=--seed=2']).stdout)
  both = _planned(_reproduce(base + ['--extra_flags=--seed=1,--total_rounds=3']).stdout)
  names = [set(planned), set(seed2), set(both)]
  assert all(len(n) == len(ARMS) for n in names)
  assert not (names[0] & names[1]) and not (names[0] & names[2]) and not (names[1] & names[2])

  # A finished --seed=1 run in its directory is reused by the same command.
  for arm_file in ARMS:
    _finished_run(runs[arm_file], arm_file, name_of[arm_file], extra=['--seed=1'],
                  scale=scale, data_dir=tmp_path)
  reused = _reproduce(base + ['--extra_flags=--seed=1'])
  assert reused.returncode == 0 and not _planned(reused.stdout), reused.stderr
  assert reused.stdout.count('complete, skipped') == len(ARMS)


def test_a_run_made_with_other_settings_is_not_reused(tmp_path):
  """A finished (or interrupted) arm whose config.json disagrees with the flags the arm would
  run with now is refused with one error line and exit 2, before any arm of any table runs."""
  table = 'li2022_adadps_stackoverflow_tag'
  runs = tmp_path / f'{table}-smoke' / 'runs'
  arm_file = os.path.join(EXPERIMENTS, table, 'dp_fedavg.flags')
  run = _finished_run(runs, arm_file, 'dp_fedavg', extra=['--total_rounds=5'])
  smoke_rounds = [l for l in open(os.path.join(EXPERIMENTS, table, 'smoke.flags'))
                  if l.startswith('--total_rounds=')][-1].strip()
  assert smoke_rounds != '--total_rounds=5'
  # --table=all: the other tables come first alphabetically and nothing of theirs starts.
  out = _reproduce(['--table=all', '--scale=smoke', '--dry_run', f'--root_output_dir={tmp_path}'])
  assert out.returncode == 2 and not _planned(out.stdout), out.stdout
  [line] = out.stderr.strip().splitlines()[-1:]
  assert line.startswith('error: ') and out.stderr.count('error:') == 1
  assert smoke_rounds in line and '(the run has 5)' in line and run in line
  # Without --dry_run: nothing runs and no table is written.
  out = _reproduce(['--table=' + table, '--arms=dp_fedavg', '--scale=smoke',
                    f'--root_output_dir={tmp_path}'])
  assert out.returncode == 2 and 'finished run' in out.stderr, out.stdout + out.stderr
  assert sorted(os.listdir(tmp_path)) == [f'{table}-smoke']
  assert sorted(os.listdir(tmp_path / f'{table}-smoke')) == ['runs']
  # An interrupted run is not resumed under other settings either.
  os.remove(os.path.join(run, 'summary.json'))
  out = _reproduce(['--table=' + table, '--arms=dp_fedavg', '--scale=smoke', '--dry_run',
                    f'--root_output_dir={tmp_path}'])
  assert out.returncode == 2 and 'interrupted run' in out.stderr and not _planned(out.stdout)
  # --extra_flags that reproduce.py sets itself, or that are not flags: refused up front.
  for extra, message in [('--experiment_name=x', 'set by reproduce.py'),
                         ('--resume', 'set by reproduce.py'),
                         ('--paper_results=accuracy=1,epsilon=2', 'is not a flag')]:
    bad = _reproduce(['--table=' + table, '--scale=smoke', '--dry_run',
                      f'--root_output_dir={tmp_path / "other"}', f'--extra_flags={extra}'])
    assert bad.returncode == 2 and message in bad.stderr and not _planned(bad.stdout), extra


@pytest.mark.slow
def test_a_second_seed_runs_and_is_tabulated_beside_the_first(one_arm_per_table, tmp_path):
  """The recipe for more seeds (docs/RUNNING.md), for real: the seed-0 run (the smoke tables' EMNIST
  run, copied: reproduce.py finds it finished), then --extra_flags=--seed=1 trains a second run
  and the table shows both and their mean ± sd."""
  import shutil  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  table, [arm] = 'andrew2021_emnist', _ONE_ARM_PER_TABLE['andrew2021_emnist']
  shutil.copytree(one_arm_per_table / f'{table}-smoke' / 'runs' / arm,
                  tmp_path / f'{table}-smoke' / 'runs' / arm)
  args = [f'--table={table}', f'--arms={arm}', '--scale=smoke', f'--root_output_dir={tmp_path}']
  first = _reproduce(args)
  assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
  assert first.stdout.count('complete, skipped') == 1
  second = _reproduce(args + ['--extra_flags=--seed=1'])
  assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
  assert 'complete, skipped' not in second.stdout
  runs = tmp_path / f'{table}-smoke' / 'runs'
  [seed1_dir] = [d for d in os.listdir(runs) if d != arm]
  seeds = {d: json.loads((runs / d / 'config.json').read_text())['seed'] for d in (arm, seed1_dir)}
  assert seeds == {arm: 0, seed1_dir: 1}
  final_acc = {d: [float(m['eval_accuracy']) for m in metrics_rows(runs / d)
                   if m.get('eval_accuracy')][-1] for d in seeds}
  text = (tmp_path / f'{table}-smoke' / 'results.md').read_text()
  rows = _table_rows(tmp_path / f'{table}-smoke' / 'results.md')
  assert sorted(rows) == sorted(seeds)
  for d, seed in seeds.items():
    assert rows[d][2] == str(seed) and float(rows[d][9]) == pytest.approx(final_acc[d], rel=1e-3)
  [mean_row] = [l for l in text.splitlines() if l.startswith('| mean ± sd (2 runs)')]
  cells = [c.strip() for c in mean_row.strip().strip('|').split('|')]
  assert cells[2] == '0, 1'
  mean, sd = (float(x) for x in cells[9].split(' ± '))
  values = list(final_acc.values())
  assert mean == pytest.approx(np.mean(values), rel=1e-3, abs=1e-6)
  assert sd == pytest.approx(np.std(values, ddof=1), rel=1e-3, abs=1e-6)
  # Same command again: both runs are finished and reused; the table keeps both seeds.
  third = _reproduce(args + ['--extra_flags=--seed=1'], timeout=300)
  assert third.returncode == 0 and third.stdout.count('complete, skipped') == 1
  assert sorted(_table_rows(tmp_path / f'{table}-smoke' / 'results.md')) == sorted(seeds)


@pytest.mark.slow
def test_an_arm_killed_like_the_oom_killer_does_not_hang_reproduce(tmp_path):
  """SIGKILL an arm's run_experiment.py mid-run: its TFF worker dies with it, so reproduce.py
  goes on, reports the arm's exit, and whoever reads reproduce.py's output sees EOF."""
  import threading  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  proc = subprocess.Popen(
      script('reproduce.py') + ['--table=andrew2021_emnist', '--arms=fixed_clip1.0',
                                '--scale=smoke', f'--root_output_dir={tmp_path}'],
      env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  deadline = time.monotonic() + 600
  arm = worker = None
  while time.monotonic() < deadline and worker is None:
    arm = next((p for p in runtime._children_of(proc.pid)
                if 'run_experiment.py' in runtime._cmdline(p)), None)
    workers = runtime.worker_pids(arm) if arm else []
    worker = workers[0] if workers else None
    time.sleep(0.2)
  assert worker is not None, 'the arm never started its TFF worker'
  os.kill(arm, 9)
  output = []
  done = threading.Event()
  threading.Thread(target=lambda: (output.append(proc.stdout.read()), done.set()),
                   daemon=True).start()
  assert done.wait(timeout=300), 'reproduce.py output never reached EOF'
  proc.wait(timeout=60)
  assert 'fixed_clip1.0: exit -9' in output[0], output[0][-2000:]
  assert not runtime._alive(worker)
