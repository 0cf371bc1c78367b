"""Every edge of a run's life (issue 37): resume, refusals and their messages."""

import json
import os

import pytest

from tff_dp.errors import UserInputError
from run_helpers import kept_figures
from run_helpers import run_stopped_after

# The demo's settings (Makefile DEMO_FLAGS), on the small tag task.
DEMO = dict(task='stackoverflow_tag', dp='adaptive', clip=0.1, noise_multiplier=0.7,
            clients_per_round=5, client_learning_rate=0.05, rounds_per_eval=1, ema_beta=0.9,
            past_k=3, uncertainty_last_k=5, eval_data='holdout', max_eval_examples=20,
            delta=1e-3)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_the_demo_run_resumes(tag_task, tmp_path, monkeypatch):
  """A run with the demo's flags (last-k uncertainty among them) stopped, then resumed to more
  rounds: it used to crash restoring the last-k models into an empty list."""
  figures = kept_figures(monkeypatch)
  settings = dict(DEMO, root_output_dir=str(tmp_path), total_rounds=2)
  first = run_stopped_after(settings, tag_task, 'demo')
  assert first.rounds_completed == 2
  resumed = run_stopped_after(dict(settings, total_rounds=4), tag_task, 'demo', resume=True)
  assert resumed.rounds_completed == 4
  with open(tmp_path / 'demo' / 'uncertainty.json') as f:
    assert json.load(f)['statistics']['accuracy']['k'] == 4   # Rounds 1-4, all kept (k = 5).
  accuracy = [f.axes[0] for f in figures if f.axes[0].get_title().startswith('Accuracy')][-1]
  assert sorted(line.get_label() for line in accuracy.lines) == [   # k and beta in the legend.
      'EMA of the models (beta = 0.9, warmup)', 'average of the last 3 models', 'last iterate']
  assert 'held-out clients' in accuracy.get_ylabel()


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_finished_run_is_not_resumed_to_fewer_rounds(tag_task, tmp_path):
  settings = dict(DEMO, root_output_dir=str(tmp_path), total_rounds=2, uncertainty_last_k=0)
  run_stopped_after(settings, tag_task, 'done')
  config = (tmp_path / 'done' / 'config.json').read_bytes()
  history = (tmp_path / 'done' / 'config_history.jsonl').read_bytes()
  before = sorted(os.walk(tmp_path / 'done'))
  for total in (1, 2):   # Fewer rounds than done, or nothing left to do: refused, unchanged.
    with pytest.raises(UserInputError, match='already completed 2 rounds'):
      run_stopped_after(dict(settings, total_rounds=total), tag_task, 'done', resume=True)
  assert sorted(os.walk(tmp_path / 'done')) == before
  assert (tmp_path / 'done' / 'config.json').read_bytes() == config
  assert (tmp_path / 'done' / 'config_history.jsonl').read_bytes() == history


def test_resume_of_a_missing_run_names_the_missing_directory(tmp_path):
  from run_helpers import main_in_process  # pylint: disable=g-import-not-at-top
  code, _, err = main_in_process('run_experiment.py', [
      '--resume', '--experiment_name=nope', f'--root_output_dir={tmp_path}'])
  assert code == 2 and f'no run directory {tmp_path}/nope' in err, err
  assert 'clip' not in err and not os.listdir(tmp_path)


@pytest.mark.parametrize('args, message', [
    (['--ledger=x', '--pld_discretization=0'], '--pld_discretization=0.0: must be in (0, 0.1]'),
    (['--ledger=x', '--pld_discretization=nan'], 'must be in (0, 0.1]'),
    (['--ledger=x', '--pld_discretization=-1'], 'must be in (0, 0.1]'),
    (['--ledger=x', '--pld_discretization=100'], 'must be in (0, 0.1]'),
    (['--target_epsilon=2', '--mechanism=bandmf', '--rounds=20', '--min_separation=2',
      '--max_participations=2', '--bands=0'], '--bands=0: must be a positive integer'),
    (['--target_epsilon=2', '--mechanism=blt', '--rounds=200', '--min_separation=5000',
      '--max_participations=6'], 'fit at most 1 times'),
    (['--plan', '--ledger=x', '--rounds=10', '--population=100', '--clients_per_round=10',
      '--plan_noise_multipliers=1'], 'give one of them'),
    (['--plan', '--rounds=10', '--population=100', '--clients_per_round=10',
      '--plan_noise_multipliers=1,1'], 'lists each value once'),
    # Issue 51, item 4: accepted before, each now refused.
    (['--target_epsilon=8.9', '--mechanism=blt', '--rounds=2000', '--min_separation=313',
      '--max_participations=2'], 'allow 7 participations'),
    (['--plan', '--rounds=1000000000', '--population=100', '--clients_per_round=10',
      '--plan_noise_multipliers=1'], 'at most 100,000 rounds'),
    (['--plan', '--target_epsilon=-2', '--rounds=10', '--population=100',
      '--clients_per_round=10', '--plan_noise_multipliers=1'], 'must be a positive number'),
    (['--plan', '--rounds=10', '--population=100', '--clients_per_round=10',
      '--plan_noise_multipliers='], 'must list at least one value'),
    ([], 'give a mode: --ledger'),
    # The re-trial of issue 51: another mode's flag was accepted and ignored.
    (['--target_epsilon=2', '--rounds=10', '--population=100', '--clients_per_round=10',
      '--plan_cohorts=5'], '--plan_cohorts is a setting of --plan, which was not given'),
    (['--target_epsilon=2', '--rounds=10', '--population=100', '--clients_per_round=10',
      '--pld_every=5'], '--pld_every is a setting of --ledger, which was not given'),
    (['--target_epsilon=2', '--rounds=10', '--population=100', '--clients_per_round=10',
      '--ledger_key=k'], '--ledger_key is a setting of --ledger'),
])
def test_the_accounting_cli_refuses_bad_values_in_one_line(args, message, capsys):
  from tff_dp.accounting import __main__ as cli  # pylint: disable=g-import-not-at-top
  assert cli.main(['prog', '--delta=1e-5'] + args) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count('\n') == 1 and message in err, err


def test_reproduce_refuses_paths_it_cannot_use_before_any_arm_runs(tmp_path):
  from run_helpers import main_in_process  # pylint: disable=g-import-not-at-top
  a_file = tmp_path / 'a_file'
  a_file.write_text('')
  for args, message in (
      ([f'--root_output_dir={a_file}'], f'{a_file} is a file, not a directory'),
      ([f'--root_output_dir={a_file}/runs'], f'{a_file} is a file, not a directory'),
      # Issue 51, item 3: generated data and started four arms before failing (81 s).
      (['--root_output_dir=/proc/tables'], '/proc refuses new directories'),
      (['--experiments_dir=/nonexistent'], '--experiments_dir /nonexistent is not a directory'),
      # Issue 51, item 4: an empty experiments directory exited 0 having printed nothing.
      ([f'--experiments_dir={tmp_path}'], f'--experiments_dir {tmp_path} holds no table'),
      # The re-trial: --data_dir at the smoke scale was ignored.
      ([f'--data_dir={tmp_path}'], '--data_dir is where --scale=full reads')):
    code, _, err = main_in_process('reproduce.py', ['--table=all'] + args)
    assert code == 2 and err.startswith('error: ') and message in err, err
    assert 'Traceback' not in err
  assert sorted(os.listdir(tmp_path)) == ['a_file']


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_stop_once_the_run_directory_exists_says_so_and_resume_continues(tag_task, tmp_path):
  """A signal after the run directory was written but before round 1: the messages say the
  directory exists and how to continue it (they said nothing was written), and `resume` does."""
  import signal  # pylint: disable=g-import-not-at-top
  from tff_dp.training import config as config_lib  # pylint: disable=g-import-not-at-top
  from tff_dp.training import experiment  # pylint: disable=g-import-not-at-top
  from tff_dp.training.run_state import stop_signal  # pylint: disable=g-import-not-at-top
  settings = dict(DEMO, root_output_dir=str(tmp_path), total_rounds=2, uncertainty_last_k=0)
  lines = []
  stop = stop_signal.StopSignal(lines.append)

  def log(line):
    lines.append(line)
    if line.startswith('run directory:'):
      stop._handle(signal.SIGINT, None)   # As Ctrl-C at that moment.
  cfg = config_lib.ExperimentConfig.from_settings(settings, experiment_name='early')
  summary = experiment.run(cfg, tag_task, log=log, stop=stop)
  assert summary.stopped_by_signal == 'SIGINT' and summary.rounds_completed == 0
  text = '\n'.join(lines)
  assert 'nothing of the run' not in text, text
  assert f'{tmp_path}/early holds the run\'s settings and keys' in text
  assert (tmp_path / 'early' / 'config.json').exists()
  assert run_stopped_after(settings, tag_task, 'early', resume=True).rounds_completed == 2


def test_messages_name_what_is_wrong_and_the_command_that_mends_it(tmp_path):
  from tasks import data_files  # pylint: disable=g-import-not-at-top
  from tff_dp import ledger as ledger_lib  # pylint: disable=g-import-not-at-top
  a_file = tmp_path / 'data'
  a_file.write_text('')
  with pytest.raises(UserInputError, match='is a file, not a directory'):
    data_files.check_data_dir(str(a_file))
  path = tmp_path / 'ledger.jsonl'
  path.write_bytes(b'{"partial')
  with pytest.raises(ledger_lib.LedgerError,
                     match=f'python -m tff_dp.accounting --repair {path}'):
    ledger_lib.read_ledger(str(path))


def test_the_worker_command_takes_the_same_help_and_error_lines_as_the_others(capsys):
  from tff_dp import worker  # pylint: disable=g-import-not-at-top
  assert worker.main(['prog', '--helpshort']) == 0
  assert 'python -m tff_dp.worker --port 8000' in capsys.readouterr().out
  for args, message in (([], '--port is required'), (['--port=0'], '--port=0'),
                        (['--port=x'], '--port=x'), (['--nope'], 'nope')):
    assert worker.main(['prog'] + args) == 2
    err = capsys.readouterr().err
    assert err.startswith('error: ') and err.count('\n') == 1 and message in err, err


def test_ctrl_c_while_generating_a_cache_is_one_line_not_a_traceback(tmp_path, monkeypatch,
                                                                    capsys):
  from tasks import synthetic_data  # pylint: disable=g-import-not-at-top

  def interrupted(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(synthetic_data, 'ensure_population_cache', interrupted)
  code = synthetic_data.main(['--family=emnist', '--population=10', f'--cache_dir={tmp_path}'])
  err = capsys.readouterr().err
  assert code == 130 and err.startswith('interrupted: ') and err.count('\n') == 1, err


_WITHOUT_TF = '''
import sys
import run_experiment
code = run_experiment.main(['run_experiment.py'] + sys.argv[1:])
print('tensorflow imported' if 'tensorflow' in sys.modules else 'no tensorflow', file=sys.stderr)
sys.exit(code)
'''


def _listing(root):
  return sorted((p, sorted(d), sorted(f)) for p, d, f in os.walk(root))


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_refusals_of_data_output_and_resume_come_before_tensorflow(tag_task, tag_data_dir,
                                                                   tmp_path):
  """Each refusal: exit 2, one `error:` line naming what is wrong, TensorFlow never imported,
  nothing written."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from run_helpers import REPO, script_env  # pylint: disable=g-import-not-at-top
  from tff_dp.training import preflight  # pylint: disable=g-import-not-at-top
  settings = dict(DEMO, root_output_dir=str(tmp_path / 'runs'), total_rounds=1,
                  uncertainty_last_k=0, data_dir=tag_data_dir, so_vocab_size=200,
                  so_tag_vocab_size=30, client_batch_size=8)
  run_stopped_after(settings, tag_task, 'made')
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'corrupt').mkdir()
  (tmp_path / 'corrupt' / 'emnist_all.sqlite').write_bytes(b'not a database')
  (tmp_path / 'a_file').write_text('')
  base = ['--dp=fixed', '--clip=0.1', '--noise_multiplier=1',
          f'--root_output_dir={tmp_path / "runs"}']
  resume = ['--resume', f'--root_output_dir={tmp_path / "runs"}', '--experiment_name=made']
  cases = [
      (['--task=emnist', '--data_dir=/proc/nope'], '--data_dir /proc/nope does not exist'),
      (['--task=emnist', f'--data_dir={tmp_path / "empty"}'], 'emnist_all.sqlite not found'),
      (['--task=emnist', f'--data_dir={tmp_path / "corrupt"}'], 'not an SQLite database'),
      (['--task=emnist', f'--data_dir={tag_data_dir}'], 'emnist_all.sqlite not found'),
      (['--task=emnist', f'--data_dir={tmp_path / "a_file"}'], 'is a file, not a directory'),
      (['--task=emnist', f'--root_output_dir={tmp_path / "a_file"}/x',
        '--experiment_name=x'], 'a_file is a file, not a directory'),
      (['--task=stackoverflow_tag', f'--data_dir={tag_data_dir}', '--experiment_name=made'],
       'already exists'),
      (resume + ['--noise_multiplier=2'], '--noise_multiplier was 0.7, now 2.0'),
      (['--task=stackoverflow_tag', f'--data_dir={tag_data_dir}', '--precondition=client',
        '--side_info=file:/nonexistent.npy'], '/nonexistent.npy: no such file'),
  ]
  before = _listing(tmp_path)
  for args, message in cases:
    out = subprocess.run([sys.executable, '-c', _WITHOUT_TF] + base + args, cwd=REPO,
                         env=script_env(), capture_output=True, text=True, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, (args, out.stderr)
    assert lines[-1] == 'no tensorflow' and len(lines) == 2, (args, out.stderr)
    assert lines[0].startswith('error: ') and message in lines[0], (args, lines[0])
  held = preflight.lock(str(tmp_path / 'runs' / 'made'))   # Another process's run, going on.
  try:
    out = subprocess.run([sys.executable, '-c', _WITHOUT_TF] + resume, cwd=REPO,
                         env=script_env(), capture_output=True, text=True, timeout=60)
  finally:
    held.close()
  assert out.returncode == 2 and 'is in use by' in out.stderr, out.stderr
  assert out.stderr.strip().splitlines()[-1] == 'no tensorflow'
  assert _listing(tmp_path) == before


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_resume_whose_state_is_missing_is_refused_before_tensorflow(tag_task, tag_data_dir,
                                                                     tmp_path):
  """Issue 51, item 1: a resume never silently weakens a run or re-charges its rounds. Each
  damaged copy of a finished run: exit 2, one `error:` line naming what is missing, TensorFlow
  never imported, nothing written."""
  import shutil  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from run_helpers import REPO, script_env  # pylint: disable=g-import-not-at-top
  settings = dict(DEMO, root_output_dir=str(tmp_path / 'runs'), total_rounds=2,
                  uncertainty_last_k=0, data_dir=tag_data_dir, so_vocab_size=200,
                  so_tag_vocab_size=30, client_batch_size=8)
  run_stopped_after(settings, tag_task, 'made')
  made = tmp_path / 'runs' / 'made'
  damages = {
      'no_secret': (lambda d: shutil.rmtree(d / 'secret'), 'lacks secret/ledger_key'),
      'no_seal': (lambda d: (d / 'secret' / 'ledger_seal').unlink(), 'secret/ledger_seal'),
      'no_checkpoints': (lambda d: shutil.rmtree(d / 'checkpoints'),
                         'released 2 rounds but holds no checkpoint'),
      'empty_ledger': (lambda d: (d / 'ledger.jsonl').write_text(''),
                       'ledger.jsonl is empty but the run released rounds'),
      'not_a_run': (lambda d: (d / 'config.json').unlink(), 'is not a run directory'),
  }
  for name, (damage, _) in damages.items():
    shutil.copytree(made, tmp_path / 'runs' / name)
    damage(tmp_path / 'runs' / name)
  before = _listing(tmp_path)
  for name, (_, message) in damages.items():
    out = subprocess.run([sys.executable, '-c', _WITHOUT_TF, '--resume', '--total_rounds=3',
                          f'--root_output_dir={tmp_path / "runs"}', f'--experiment_name={name}'],
                         cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines[-1] == 'no tensorflow', (name, out.stderr)
    assert lines[0].startswith('error: ') and message in lines[0], (name, lines[0])
  assert _listing(tmp_path) == before
  # Re-executing released rounds is an explicit choice, and the console counts what it charges.
  from run_helpers import main_in_process  # pylint: disable=g-import-not-at-top
  from tff_dp import ledger as ledger_lib  # pylint: disable=g-import-not-at-top
  code, out, err = main_in_process('run_experiment.py', [
      '--resume', '--total_rounds=3', '--rerun_released_rounds',
      f'--root_output_dir={tmp_path / "runs"}', '--experiment_name=no_checkpoints'])
  assert code == 0, err[-2000:]
  assert 'rounds 1-2 released metrics after the last checkpoint (round 0)' in out, out
  assert 're-executing them charges 2 round(s) again' in out, out
  rounds = [r.round_num for r in ledger_lib.read_ledger(
      str(tmp_path / 'runs' / 'no_checkpoints' / 'ledger.jsonl'))]
  assert rounds == [1, 2, 1, 2, 3], rounds   # Charged twice, as announced.


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_run_leaves_the_callers_random_states_and_matplotlib_as_it_found_them(tag_task,
                                                                                  tmp_path):
  """Issue 38, item 4: no backend switching, no global reseeding left behind."""
  import random  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import matplotlib  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  random.seed(1234)
  np.random.seed(4321)
  python_state, numpy_state = random.getstate(), np.random.get_state()
  tf.random.set_seed(77)   # The caller's TensorFlow seed: its next draw, computed first.
  tf_draw = tf.random.uniform([3]).numpy()
  tf.random.set_seed(77)
  backend, had_pyplot = matplotlib.get_backend(), 'matplotlib.pyplot' in sys.modules
  settings = dict(DEMO, root_output_dir=str(tmp_path), total_rounds=1, uncertainty_last_k=0)
  assert run_stopped_after(settings, tag_task, 'states').rounds_completed == 1
  assert os.path.exists(tmp_path / 'states' / 'plots' / 'epsilon_vs_round.png')
  assert random.getstate() == python_state
  after = np.random.get_state()
  assert after[0] == numpy_state[0] and np.array_equal(after[1], numpy_state[1])
  assert after[2:] == numpy_state[2:]
  np.testing.assert_array_equal(tf.random.uniform([3]).numpy(), tf_draw)
  assert matplotlib.get_backend() == backend
  assert ('matplotlib.pyplot' in sys.modules) == had_pyplot
