"""Bad input to run_experiment.py: one clear line on stderr, exit code 2, nothing clobbered."""

import hashlib
import os
import re
import subprocess
import sys

import pytest

import tasks  # noqa: F401  (registers the tasks and their settings section, as the CLI does)
from run_helpers import REPO
from run_helpers import script
from run_helpers import script_env
from tff_dp import sections
from tff_dp.execution import gc_thresholds


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
  (run / 'config.json').write_text('{}')   # A run directory (one that recorded no setting).
  (run / 'metrics.csv').write_text('round,train_loss\n1,2.0\n')
  (run / 'ledger.jsonl').write_text('{"precious": true}\n')
  (run / 'checkpoints' / 'round_1').write_text('state')
  return run


BAD = [
    (['--task=mnist_nope'], 'flag --task=mnist_nope: value should be one of'),
    (['--bogus_flag'], "Unknown command line flag 'bogus_flag'"),
    (['--clip=-1'], '--clip must be positive, got -1.0'),
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


# run_experiment.main in a fresh interpreter that then states whether TensorFlow was imported.
_MAIN_WITHOUT_TF = ('import sys, run_experiment; code = run_experiment.main(sys.argv); '
                    'print("tensorflow imported:", "tensorflow" in sys.modules); sys.exit(code)')


def _run_main(args, cwd):
  proc = subprocess.run([sys.executable, '-c', _MAIN_WITHOUT_TF] + args, cwd=cwd,
                        env=script_env(), capture_output=True, text=True, timeout=120)
  return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize('args,message', [
    (['--bogus_flag'], "error: Unknown command line flag 'bogus_flag'"),
    (['--clip=-1'], 'error: --clip must be positive, got -1.0'),
    (['--dp=fixed', '--clip=1'], 'error: --dp=fixed needs --noise_multiplier >= 0'),
    (['--task=nope'], 'error: flag --task=nope: value should be one of '
                      '<emnist|stackoverflow_word|stackoverflow_tag>'),
    (['--dp=none', 'stray'], "error: unexpected arguments ['stray']"),
    (['--dp=none', '--paper_results=accuracy'],
     "error: --paper_results: expected key=number, got 'accuracy'"),
])
def test_flag_errors_exit_2_before_tensorflow_is_imported(args, message, tmp_path):
  code, out, err = _run_main(args, tmp_path)
  assert code == 2, err
  assert _error_lines(err) == [message], err
  assert 'tensorflow imported: False' in out
  assert os.listdir(tmp_path) == []


def test_help_lists_every_flag_grouped_by_section(tmp_path):
  from tff_dp.training import config as config_lib  # pylint: disable=g-import-not-at-top
  code, out, _ = _run_main(['--helpshort'], tmp_path)
  assert code == 0 and 'tensorflow imported: False' in out
  headers = [l.split(':')[0] for l in out.splitlines() if l and not l.startswith(' ')
             and l.split(':')[0] in config_lib.all_sections()]
  # Every section once, in declaration order; the tasks' own after `task`.
  assert headers == list(config_lib.all_sections())
  assert headers[:3] == ['task', 'task_options', 'sampling']
  blocks = dict(zip(headers, out.split('\n\n')[-len(headers):]))
  for section, fields in config_lib.fields_by_section().items():
    for field in fields:   # Each flag with its help, in its section's block.
      name = sections.setting_name(field)
      # absl wraps a long enum after the colon: a space or a newline follows it.
      assert re.search(rf'--(\[no\])?{name}:\s', blocks[section]), name
  for section, flag in [('task', '--task'), ('dp', '--clip'), ('dp', '--dp'),
                        ('accounting', '--max_epsilon'), ('adadps', '--precondition'),
                        ('checkpoint_aggregation', '--ema_beta'), ('output', '--[no]resume'),
                        ('runtime', '--workers'), ('sampling', '--clients_per_round')]:
    assert re.search(rf'{re.escape(flag)}:\s', blocks[section]), flag
  # Library help names parameters in backticks; the CLI shows them as its flags.
  assert '--embedded_data_dir; no download' in ' '.join(blocks['task'].split())
  assert '`' not in blocks['task']


def test_library_parameters_read_as_flags_on_the_command_line(tmp_path):
  """The library names parameters (`dp=fixed`, `clip`); the CLI prints them as its flags."""
  from tff_dp import cli_flags  # pylint: disable=g-import-not-at-top
  from tff_dp.errors import UserInputError  # pylint: disable=g-import-not-at-top
  from tff_dp.training import config as config_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserInputError) as raised:
    config_lib.ExperimentConfig.from_settings(root_output_dir=str(tmp_path), experiment_name='x',
                                              dp='fixed', noise_multiplier=1.0)
  message = str(raised.value)
  assert message.startswith('`dp=fixed` needs `clip` (') and '--' not in message
  assert (cli_flags.as_flags('`dp=fixed` needs `clip`, not `clip_norm` (see `tff_dp.run`)',
                             {'dp', 'clip'})
          == '--dp=fixed needs --clip, not `clip_norm` (see `tff_dp.run`)')


def test_the_program_sets_the_collector_thresholds_and_importing_it_does_not():
  """`python run_experiment.py` sets Python's collector thresholds (tff_dp.execution.
  gc_thresholds: the collector's share of start-up); importing run_experiment (as the tests'
  in-process runs do) leaves the process's own."""
  program = """
import atexit, gc, runpy, sys
default = gc.get_threshold()
import run_experiment
imported = gc.get_threshold()
sys.argv = ['run_experiment.py', '--helpshort']
# The program ends its process itself (cli_flags.exit_now), after the at-exit handlers.
atexit.register(lambda: print(default, imported, gc.get_threshold(),
                              'tensorflow' in sys.modules, sep=';', flush=True))
runpy.run_path(run_experiment.__file__, run_name='__main__')
"""
  done = subprocess.run([sys.executable, '-c', program], env=script_env(), capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  default, imported, program_set, tensorflow = done.stdout.splitlines()[-1].split(';')
  assert imported == default == str((700, 10, 10))   # CPython's defaults.
  assert program_set == str(gc_thresholds.THRESHOLDS) != default and tensorflow == 'False'


@pytest.fixture(scope='module')
def emnist_40(tmp_path_factory):
  """A TFF-format EMNIST cache of 40 training clients, 10 of them with test data."""
  from tasks import synthetic_data  # pylint: disable=g-import-not-at-top
  data_dir = tmp_path_factory.mktemp('emnist_40')
  synthetic_data.write_emnist_cache(str(data_dir), num_train_clients=40, examples_per_client=3,
                                    seed=0, num_test_clients=10)
  return data_dir


SIZE_REFUSALS = [   # Issue 51, item 3: each took 10-20 s, after TensorFlow.
    (['--clients_per_round=100000'], 'error: --clients_per_round=100000 exceeds the 40 '
                                     'training clients'),
    (['--delta=0.05'], 'error: --delta=0.05 is not below 1/population = 1/40'),
    (['--num_canaries=2', '--delta=0.05'], 'error: --delta=0.05 is not below 1/population = '
                                           '1/42'),
    (['--eval_data=holdout', '--eval_holdout_clients=5000'],
     'error: --eval_holdout_clients=5000 must be in [1, 10): held out from 10 clients'),
    (['--eval_data=holdout', '--eval_holdout_clients=5', '--clients_per_round=36'],
     'error: --clients_per_round=36 exceeds the 35 training clients'),
    (['--max_train_clients=20', '--clients_per_round=30'],
     'error: --clients_per_round=30 exceeds the 20 training clients'),
    (['--dp=blt', '--client_sampling=min_separation', '--min_separation=100000'],
     'error: --min_separation=100000: the sampler visits each client every 4 rounds'),
    (['--dp=blt', '--client_sampling=min_separation', '--max_participations=1',
      '--total_rounds=100'],
     'error: --max_participations=1: over 100 rounds a client participates up to 25 times'),
    (['--precondition=client', '--side_info=word_freq'],
     "error: --side_info=word_freq is not side information of task 'emnist'"),
    (['--embedded_data_dir=README.md', '--data_dir='], None),   # Below: a file, not a dir.
    (['--root_output_dir=/proc/runs'], 'error: --root_output_dir /proc/runs is not writable: '
                                       '/proc refuses new directories'),
]


@pytest.mark.parametrize('args,message', SIZE_REFUSALS)
def test_what_the_population_decides_is_refused_before_tensorflow(args, message, emnist_40,
                                                                  tmp_path):
  """The population's size from the task's client ids, read without TensorFlow: each refusal
  in under a second's work, with the message the run gives once its task is built."""
  base = ['--task=emnist', '--dp=fixed', '--clip=1', '--noise_multiplier=1',
          '--clients_per_round=10', f'--data_dir={emnist_40}',
          f'--root_output_dir={tmp_path / "runs"}']
  if args[0].startswith('--embedded_data_dir'):
    base = [a for a in base if not a.startswith('--data_dir')]
    args = [f'--embedded_data_dir={os.path.join(REPO, "README.md")}']
    message = f'error: --embedded_data_dir {os.path.join(REPO, "README.md")}: '
  code, out, err = _run_main(base + args, tmp_path)
  assert code == 2, err
  assert len(_error_lines(err)) == 1 and _error_lines(err)[0].startswith(message), err
  assert 'tensorflow imported: False' in out
  assert not (tmp_path / 'runs').exists()


def test_the_client_ids_read_without_tensorflow_are_the_loaders(emnist_40):
  """`tasks.client_ids` lists what TFF's own loader lists, in its order (the population's
  first `max_train_clients` are the same clients)."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  import tasks as tasks_lib  # pylint: disable=g-import-not-at-top
  train, test = tff.simulation.datasets.emnist.load_data(only_digits=False,
                                                        cache_dir=str(emnist_40))
  assert tasks_lib.client_ids('emnist', str(emnist_40)) == (train.client_ids, test.client_ids)
  assert len(train.client_ids) == 40 and len(test.client_ids) == 10
