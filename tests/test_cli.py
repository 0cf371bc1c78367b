"""Bad input to run_experiment.py: one clear line on stderr, exit code 2, nothing clobbered."""

import hashlib
import os
import subprocess
import sys

import pytest

from run_helpers import REPO
from run_helpers import script
from run_helpers import script_env


def _run(args, cwd):
  proc = subprocess.run(script('run_experiment.py') + args,
                        cwd=cwd, env=script_env(), capture_output=True, text=True, timeout=300)
  return proc.returncode, proc.stdout, proc.stderr


def _error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith('error:')]


def _tree_digest(path):
  digest = {}
  for root, _, files in os.walk(path):
    for name in files:
      full = os.path.join(root, name)
      with open(full, 'rb') as f:
        digest[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
  return digest


@pytest.fixture
def existing_run(tmp_path):
  run = tmp_path / 'runs' / 'exp'
  (run / 'checkpoints').mkdir(parents=True)
  (run / 'metrics.csv').write_text('round,train_loss\n1,2.0\n')
  (run / 'ledger.jsonl').write_text('{"precious": true}\n')
  (run / 'checkpoints' / 'round_1').write_text('state')
  return run


BAD = [
    (['--task=mnist_nope'], 'unknown --task'),
    (['--clients_per_round=0', '--dp=none'], '--clients_per_round must be a positive integer'),
    (['--clients_per_round=-3', '--dp=none'], '--clients_per_round must be a positive integer'),
    (['--dp=fixed', '--noise_multiplier=1.0'], 'needs --clip'),
    (['--dp=none', '--noise_multiplier=1.0'], '--noise_multiplier needs DP'),
    (['--dp=fixed', '--clip=1', '--noise_multiplier=1', '--weighting=num_examples'],
     'requires uniform client weighting'),
    (['--dp=fixed', '--clip=1', '--noise_multiplier=1', '--data_dir=/nonexistent/tff_cache'],
     '/nonexistent/tff_cache'),
]


@pytest.mark.parametrize('args,message', BAD)
def test_bad_input_exits_2_with_one_line(args, message, tmp_path, existing_run):
  before = _tree_digest(existing_run)
  code, _, stderr = _run(args + [f'--root_output_dir={existing_run.parent}',
                                 '--experiment_name=exp', '--resume'], cwd=tmp_path)
  assert code == 2, stderr
  lines = _error_lines(stderr)
  assert len(lines) == 1, stderr
  assert message in lines[0]
  assert 'Traceback' not in stderr
  assert _tree_digest(existing_run) == before


@pytest.mark.parametrize('damage', ['truncate', 'garbage'])
def test_corrupt_sqlite_is_reported_and_run_dir_untouched(damage, tmp_path, existing_run):
  from tasks import synthetic_data
  cache = tmp_path / 'cache'
  synthetic_data.write_emnist_cache(str(cache), num_train_clients=3, examples_per_client=5,
                                    seed=0)
  db = next(p for p in cache.iterdir() if p.name.endswith('.sqlite'))
  data = db.read_bytes()
  db.write_bytes(data[:len(data) // 3] if damage == 'truncate' else b'not a database' * 100)
  before = _tree_digest(existing_run)
  code, _, stderr = _run(['--dp=fixed', '--clip=1', '--noise_multiplier=1',
                          f'--data_dir={cache}', f'--root_output_dir={existing_run.parent}',
                          '--experiment_name=exp', '--resume'], cwd=tmp_path)
  assert code == 2, stderr
  lines = _error_lines(stderr)
  assert len(lines) == 1 and db.name in lines[0], stderr
  assert _tree_digest(existing_run) == before


def test_existing_run_dir_is_not_overwritten(tmp_path, existing_run):
  before = _tree_digest(existing_run)
  code, _, stderr = _run(['--dp=none', f'--root_output_dir={existing_run.parent}',
                          '--experiment_name=exp', '--total_rounds=1'], cwd=tmp_path)
  assert code == 2
  assert 'already exists' in _error_lines(stderr)[0]
  assert _tree_digest(existing_run) == before


def test_help_reads_well(tmp_path):
  env = dict(os.environ, PYTHONPATH=REPO)
  out = subprocess.run([sys.executable, os.path.join(REPO, 'run_experiment.py'), '--helpshort'],
                       capture_output=True, text=True, env=env, timeout=120).stdout
  for flag in ('--task', '--clients_per_round', '--clip', '--noise_multiplier', '--dp',
               '--max_epsilon', '--precondition', '--ema_beta', '--resume'):
    assert flag in out


def test_library_parameters_read_as_flags_on_the_command_line(tmp_path):
  """The library names parameters (`dp=fixed`, `clip`); the CLI prints them as its flags."""
  from tff_dp import cli_flags  # pylint: disable=g-import-not-at-top
  from tff_dp.errors import UserInputError  # pylint: disable=g-import-not-at-top
  from tff_dp.training import experiment  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserInputError) as raised:
    experiment.ExperimentConfig(str(tmp_path), 'x', dp='fixed', noise_multiplier=1.0).validate()
  message = str(raised.value)
  assert message.startswith('`dp=fixed` needs `clip` (') and '--' not in message
  assert (cli_flags.as_flags('`dp=fixed` needs `clip`, not `clip_norm` (see `tff_dp.run`)',
                             {'dp', 'clip'})
          == '--dp=fixed needs --clip, not `clip_norm` (see `tff_dp.run`)')
