"""A newcomer's first hour (issue 25): refused input leaves the file system exactly as it was,
a resume needs only where the run is, and the defaults work where the README says they do.

Oracles: snapshots of directory trees (paths and bytes) taken by the test, literal flag names,
and config.json as the run recorded it.
"""

import json
import os
import signal

import pytest

from tff_dp import ledger as ledger_lib
from tff_dp.training import config as config_lib
from tff_dp.training import config_flags
from tff_dp.training.run_state import stop_signal
from run_helpers import main_in_process

BASE = ['--task=stackoverflow_tag', '--dp=adaptive', '--clip=0.5', '--noise_multiplier=0.7',
        '--clients_per_round=4', '--total_rounds=2', '--max_eval_examples=20',
        '--client_batch_size=8', '--so_vocab_size=200', '--so_tag_vocab_size=30',
        '--accounting=rdp', '--delta=1e-3']


def _snapshot(path):
  """{relative path: bytes} of every file below `path`, and its directories."""
  if not os.path.exists(path):
    return None
  files = {}
  for root, dirs, names in os.walk(path):
    for d in dirs:
      files[os.path.relpath(os.path.join(root, d), path) + '/'] = b''
    for name in names:
      full = os.path.join(root, name)
      with open(full, 'rb') as f:
        files[os.path.relpath(full, path)] = f.read()
  return files


def _refused(args):
  code, out, err = main_in_process('run_experiment.py', args)
  lines = [l for l in err.splitlines() if l.startswith('error:')]
  assert code == 2 and len(lines) == 1, (code, err[-2000:])
  return lines[0]


@pytest.mark.parametrize('extra,named', [
    (['--clients_per_round=30'], '--clients_per_round'),          # Above the population.
    (['--clipped_count_stddev=0.2'], '--clipped_count_stddev'),   # Impossible noise split.
    (['--max_epsilon=0.01'], '--max_epsilon'),                    # First round alone exceeds.
    (['--precondition=client', '--side_info=file:/nonexistent.npy'], 'nonexistent'),
    (['--max_train_clients=3'], '--clients_per_round'),
    (['--delta=0.5'], '--delta'),
    (['--eval_data=holdout', '--eval_holdout_clients=100'], '--eval_holdout_clients'),
    (['--embedded_data_dir=/proc/nope'], '--embedded_data_dir'),   # Was a traceback.
])
def test_refused_new_runs_write_nothing(extra, named, tag_data_dir, tmp_path):
  root = tmp_path / 'runs' / 'deeper'
  data = [] if '--embedded_data_dir' in named else [f'--data_dir={tag_data_dir}']
  line = _refused(BASE + data + [f'--root_output_dir={root}', '--experiment_name=x'] + extra)
  assert named in line, line
  assert not (tmp_path / 'runs').exists()   # Not even the root directory.


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_refused_resumes_change_nothing(tag_data_dir, tmp_path):
  args = BASE + [f'--data_dir={tag_data_dir}', f'--root_output_dir={tmp_path}',
                 '--experiment_name=run']
  code, _, err = main_in_process('run_experiment.py', args)
  assert code == 0, err[-2000:]
  run = tmp_path / 'run'
  before = _snapshot(run)
  # A changed mechanism, then a damaged ledger: both refused, the directory unchanged to the
  # byte (.lock, config.json, config_history.jsonl and the ledger included).
  assert '--noise_multiplier' in _refused(args + ['--resume', '--noise_multiplier=2'])
  assert _snapshot(run) == before
  ledger_path = run / 'ledger.jsonl'
  lines = ledger_path.read_bytes().splitlines(keepends=True)
  lines[0] = lines[0].replace(b'"round_num":1', b'"round_num":7')
  ledger_path.write_bytes(b''.join(lines))
  damaged = _snapshot(run)
  assert 'ledger' in _refused(args + ['--resume', '--total_rounds=3'])
  assert _snapshot(run) == damaged


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_resume_needs_only_where_the_run_is(tag_data_dir, tmp_path):
  root = tmp_path / 'runs'
  args = BASE + [f'--data_dir={tag_data_dir}', f'--root_output_dir={root}',
                 '--experiment_name=so2', '--sampling_seed=3']
  code, _, err = main_in_process('run_experiment.py', args)
  assert code == 0, err[-2000:]
  # Only the location, spelled differently (trailing slash), and one allowed change.
  code, out, err = main_in_process('run_experiment.py', [
      f'--root_output_dir={root}/', '--experiment_name=so2', '--resume', '--total_rounds=3'])
  assert code == 0, err[-2000:]
  assert 'resuming at round 3' in out
  # A moved and renamed run directory is the same run.
  os.rename(root / 'so2', tmp_path / 'so2trunc')
  code, out, err = main_in_process('run_experiment.py', [
      f'--root_output_dir={tmp_path}', '--experiment_name=so2trunc', '--resume',
      '--total_rounds=4'])
  assert code == 0, err[-2000:]
  records = ledger_lib.read_ledger(str(tmp_path / 'so2trunc' / 'ledger.jsonl'))
  assert [r.round_num for r in records] == [1, 2, 3, 4]
  recorded = json.loads((tmp_path / 'so2trunc' / 'config.json').read_text())
  assert recorded['noise_multiplier'] == 0.7 and recorded['sampling_seed'] == 3


def test_resume_without_a_run_name_says_what_it_needs(tmp_path):
  assert '--experiment_name' in _refused([f'--root_output_dir={tmp_path}', '--resume'])


def test_dp_ftrl_needs_no_checkpoint_flag():
  cfg = config_flags.parse(['--dp=ftrl', '--clip=1', '--noise_multiplier=1',
                            '--client_sampling=shuffled'])
  assert cfg.rounds_per_checkpoint == 1
  assert config_flags.parse(['--dp=fixed', '--clip=1',
                             '--noise_multiplier=1']).rounds_per_checkpoint == 10
  with pytest.raises(Exception, match='rounds_per_checkpoint=1'):
    config_flags.parse(['--dp=ftrl', '--clip=1', '--noise_multiplier=1',
                        '--client_sampling=shuffled', '--rounds_per_checkpoint=5'])


def test_small_cohorts_work_with_the_default_count_noise():
  # The demo's z = 0.7 at 5 clients per round: m / 20 = 0.25 would spend the whole budget.
  cfg = config_lib.ExperimentConfig.from_settings(
      dp='adaptive', clip=0.1, noise_multiplier=0.7, clients_per_round=5)
  assert cfg.dp.clipped_count_stddev is None
  from tff_dp import noise_budget
  sigma_b = noise_budget.resolve_clipped_count_stddev(None, 5, 0.7)
  assert sigma_b == 0.7
  # z^-2 = z_v^-2 + (2 sigma_b)^-2, solved by hand: z_v = 0.7 * 2 / sqrt(3).
  assert noise_budget.update_noise_multiplier(0.7, sigma_b) == pytest.approx(0.7 * 2 / 3**0.5)
  # Large cohorts keep the paper's m / 20.
  assert noise_budget.resolve_clipped_count_stddev(None, 100, 0.7) == 5.0


def test_ctrl_c_before_the_first_round_does_not_promise_a_checkpoint():
  said = []
  stop = stop_signal.StopSignal(said.append)
  stop._handle(signal.SIGINT, None)   # pylint: disable=protected-access
  assert 'no round has started' in said[-1] and 'checkpoint' not in said[-1]
  stop = stop_signal.StopSignal(said.append)
  stop.rounds_started = True
  stop._handle(signal.SIGINT, None)   # pylint: disable=protected-access
  assert 'after the current round, with a checkpoint' in said[-1]


# The accounting CLI.

def _ledger(path, rounds, sampling=None):
  sampling = sampling or ledger_lib.SamplingEvent('poisson', 100, probability=0.1)
  with ledger_lib.PrivacyLedger(str(path)) as led:
    for t in range(1, rounds + 1):
      led.append(ledger_lib.RoundRecord(t, sampling, (
          ledger_lib.GaussianSumQuery('update', 1.0, 0.7),)))


def test_accounting_cli_refuses_an_empty_ledger_and_a_sampling_tree(tmp_path):
  from tff_dp.accounting import __main__ as cli
  _ledger(tmp_path / 'empty.jsonl', 0)
  assert cli.main(['prog', '--ledger', str(tmp_path / 'empty.jsonl'), '--delta', '1e-3']) == 2
  assert cli.main(['prog', '--target_epsilon', '8', '--mechanism=tree', '--rounds', '16',
                   '--clients_per_round', '10', '--population', '100', '--delta', '1e-3',
                   '--sampling=poisson']) == 2


def test_accounting_cli_repairs_a_truncated_ledger_and_replays_it_quickly(tmp_path):
  import dp_accounting
  from tff_dp.accounting import __main__ as cli
  path = tmp_path / 'ledger.jsonl'
  _ledger(path, 8)
  with open(path, 'ab') as f:
    f.write(b'{"record": {"queries"')   # A crash mid-write.
  assert cli.main(['prog', '--ledger', str(path), '--delta', '1e-3']) == 2
  assert cli.main(['prog', '--repair', str(path)]) == 0
  assert len(ledger_lib.read_ledger(str(path))) == 8
  assert list(tmp_path.glob('ledger.jsonl.corrupt-*'))
  import contextlib
  import io
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert cli.main(['prog', '--ledger', str(path), '--delta', '1e-3', '--method', 'pld']) == 0
  last = float(out.getvalue().strip().splitlines()[-1].split(',')[2])
  # The default grid (1e-3) is pessimistic and close to dp_accounting's own default (1e-4).
  acc = dp_accounting.pld.PLDAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(0.7)), 8)
  exact = acc.get_epsilon(1e-3)
  assert exact <= last <= exact * 1.001


def test_reproduce_refuses_an_unknown_table_and_writes_nothing(tmp_path):
  root = tmp_path / 'runs'
  code, _, err = main_in_process('reproduce.py', ['--table=no_such_table',
                                                  f'--root_output_dir={root}'])
  assert code == 2 and err.strip().startswith('error:'), err
  assert not root.exists()
