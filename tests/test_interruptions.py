"""Interruption at every phase of a run's life (issue 37), with real signals to a real command:
Ctrl-C (SIGINT to the whole process group, as a terminal sends it), twice, and SIGTERM, before
the run directory exists, once it exists, and mid-round. Each ends with 128 + signal within
10 s, says what is true of the disk, leaves no TFF worker, and the same command (nothing
written) or `--resume` (a run directory) then does the right thing. Mid-round single signals:
tests/test_faults.py."""

import os
import signal
import subprocess
import sys
import time

import pytest

from run_helpers import main_in_process
from run_helpers import metrics_rows
from run_helpers import script
from run_helpers import script_env
from tff_dp import ledger as ledger_lib
from tff_dp.execution import runtime
from tff_dp.training import config_flags
from tff_dp.training import preflight

ARGS = ['--task=emnist', '--emnist_only_digits', '--dp=fixed', '--clip=0.5',
        '--noise_multiplier=0.5', '--clients_per_round=5', '--max_eval_examples=100',
        '--client_batch_size=10', '--max_elements_per_client=30', '--delta=1e-3',
        '--experiment_name=x', '--total_rounds=3']
EXIT_SECONDS = 10


class _Command:
  """run_experiment.py in its own process group (a terminal's foreground job)."""

  def __init__(self, root):
    self.args = ARGS + [f'--root_output_dir={root}']
    self.run_dir = os.path.join(root, 'x')
    self.proc = subprocess.Popen(script('run_experiment.py') + self.args, env=script_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
    self.seen = []

  def wait_for(self, needle: str) -> None:
    for line in self.proc.stdout:
      self.seen.append(line)
      if needle in line:
        return
    raise AssertionError(f'{needle!r} not printed: {"".join(self.seen)[-2000:]}')

  def wait_for_tensorflow_import(self, timeout: float = 60) -> None:
    """Until TensorFlow's library is mapped: the command is importing it, its handlers long
    installed (a signal in the interpreter's first instants meets Python's defaults)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      with open(f'/proc/{self.proc.pid}/maps') as f:
        if 'libtensorflow' in f.read():
          return
      time.sleep(0.05)
    raise AssertionError('TensorFlow was never imported')

  def ctrl_c(self) -> None:
    os.killpg(self.proc.pid, signal.SIGINT)

  def finish(self) -> tuple[int, str, str]:
    """(exit code, stdout, stderr), the process having ended within EXIT_SECONDS."""
    self.workers = runtime.worker_pids(self.proc.pid)
    start = time.monotonic()
    try:
      out, err = self.proc.communicate(timeout=EXIT_SECONDS)
    except subprocess.TimeoutExpired:
      os.killpg(self.proc.pid, signal.SIGKILL)
      out, err = self.proc.communicate()
      raise AssertionError(f'still running {EXIT_SECONDS} s after the signal: '
                           f'{"".join(self.seen) + out}{err[-2000:]}')
    assert time.monotonic() - start < EXIT_SECONDS
    time.sleep(0.3)
    assert not any(runtime._alive(p) for p in self.workers)  # pylint: disable=protected-access
    assert 'Traceback' not in err, err[-3000:]
    return self.proc.returncode, ''.join(self.seen) + out, err


def _nothing_written_and_the_same_command_is_accepted(command):
  assert not os.path.exists(command.run_dir)
  preflight.check(config_flags.parse(command.args))   # Would refuse an existing directory.


def _resume_completes(command, done: int):
  code, out, err = main_in_process('run_experiment.py', command.args + ['--resume'])
  assert code == 0, err[-2000:]
  assert f'resuming at round {done + 1}' in out or (done == 0 and 'round    1/3' in out), out
  assert [int(r['round']) for r in metrics_rows(command.run_dir)] == [1, 2, 3]
  rounds = [r.round_num for r in ledger_lib.read_ledger(os.path.join(command.run_dir,
                                                                     'ledger.jsonl'))]
  assert sorted(set(rounds)) == [1, 2, 3], rounds   # Every round that ran is counted,
  assert all(rounds.count(r) == 1 for r in range(1, done + 1)), rounds   # kept ones once.


def test_a_signal_before_anything_is_written_is_the_callers_to_end_on(monkeypatch):
  """The command line ends its process on the first signal while nothing is written: the next
  step of start-up that looks at the flag can be seconds away (a CI run saw a single Ctrl-C,
  and a double one whose signals Python handled once, still running 10 s later: the rest of
  TensorFlow's import, then the task), and a KeyboardInterrupt raised inside that import can be
  swallowed. Once the run directory exists: a flag, then the exception (the caller's cleanup
  leaves it consistent)."""
  from tff_dp.training.run_state import stop_signal  # pylint: disable=g-import-not-at-top
  # This test process's TFF worker (other files' tests use it) is not the signal's to stop.
  monkeypatch.setattr(stop_signal.runtime, 'shutdown_workers', lambda: None)
  ended = []
  with stop_signal.StopSignal(lambda line: None, end_start_up=ended.append):
    signal.raise_signal(signal.SIGTERM)
    assert ended == [signal.SIGTERM]   # At the first signal.
  ended.clear()
  with stop_signal.StopSignal(lambda line: None, end_start_up=ended.append) as stop:
    stop.run_dir = '/some/run'
    signal.raise_signal(signal.SIGINT)   # The first: a flag only.
    assert stop.received == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
      signal.raise_signal(signal.SIGINT)
  assert not ended


@pytest.mark.parametrize('signum, aborts', [(signal.SIGINT, KeyboardInterrupt),
                                            (signal.SIGTERM, SystemExit)])
def test_an_abort_that_lands_in_a_finalizer_is_raised_again_after_it(monkeypatch, signum,
                                                                      aborts):
  """The second signal's exception, raised while Python runs a finalizer (here a weakref
  callback; in a CI run, a WeakKeyDictionary's, during a collection), would be printed as
  "Exception ignored" and dropped, and the abort with it: it is raised again in the code that
  runs next, and nothing is printed."""
  import weakref  # pylint: disable=g-import-not-at-top
  from tff_dp.training.run_state import stop_signal  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(stop_signal.runtime, 'shutdown_workers', lambda: None)
  dropped = []   # What Python would print as "Exception ignored".
  monkeypatch.setattr(sys, 'unraisablehook', dropped.append)
  finalized = []

  class _Dying:
    pass

  with stop_signal.StopSignal(lambda line: None) as stop:
    stop.rounds_started = True
    signal.raise_signal(signum)   # The first: a flag only.
    dying = _Dying()
    ref = weakref.ref(dying, lambda _: (signal.raise_signal(signum), finalized.append(1)))
    with pytest.raises(aborts):
      del dying   # The finalizer runs here, and the second signal inside it.
      time.sleep(5)   # The code that runs next, where the abort is raised again at once.
    assert ref() is None and not finalized   # The abort did cut the finalizer short.
  assert not dropped and sys.unraisablehook == dropped.append   # Nothing printed; restored.


@pytest.mark.slow
@pytest.mark.parametrize('signals', [1, 2])
def test_ctrl_c_before_the_run_directory_exists_writes_nothing(tmp_path, signals):
  command = _Command(tmp_path)
  command.wait_for_tensorflow_import()   # Seconds before anything is written.
  for _ in range(signals):
    command.ctrl_c()
    time.sleep(0.2)
  code, out, err = command.finish()
  assert code == 130
  assert 'nothing of the run was written' in out + err, out + err
  assert 'resume' not in (out + err).split('send it again')[-1], out + err
  _nothing_written_and_the_same_command_is_accepted(command)


@pytest.mark.slow
@pytest.mark.parametrize('how', ['ctrl_c', 'ctrl_c_as_the_worker_starts', 'ctrl_c_twice',
                                 'sigterm'])
def test_a_signal_once_the_run_directory_exists_says_so_and_resume_runs_every_round(tmp_path,
                                                                                   how):
  """A Ctrl-C here used to hang for good: it killed TFF's worker as it started, and TFF waited
  for it (2 of 4 tries by hand; the worker now has its own process group)."""
  command = _Command(tmp_path)
  command.wait_for('run directory:')
  if how == 'ctrl_c_as_the_worker_starts':
    time.sleep(0.5)
  if how == 'sigterm':
    command.proc.send_signal(signal.SIGTERM)
  else:
    command.ctrl_c()
  if how == 'ctrl_c_twice':
    time.sleep(0.2)
    command.ctrl_c()
  code, out, err = command.finish()
  assert code == (143 if how == 'sigterm' else 130), out + err
  assert 'nothing of the run was written' not in out + err
  assert command.run_dir in out + err and '--resume' in out + err, out + err
  assert os.path.isfile(os.path.join(command.run_dir, 'config.json'))
  assert not os.path.exists(os.path.join(command.run_dir, 'metrics.csv'))
  _resume_completes(command, done=0)


@pytest.mark.slow
def test_ctrl_c_twice_mid_round_keeps_the_rounds_before_and_resume_counts_the_rest(tmp_path):
  command = _Command(tmp_path)
  command.wait_for('round    1/3')
  workers = runtime.worker_pids(command.proc.pid)
  assert workers and all(os.getpgid(w) != os.getpgid(command.proc.pid) for w in workers), (
      'a Ctrl-C to the job would reach TFF\'s worker')
  command.ctrl_c()
  time.sleep(0.1)
  command.ctrl_c()
  code, out, err = command.finish()
  assert code == 130 and '--resume' in out + err, out + err
  done = len(metrics_rows(command.run_dir))
  assert done in (1, 2)   # Round 2 abandoned, or it completed before the second signal.
  _resume_completes(command, done)
