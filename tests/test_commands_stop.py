"""Every command stops at the first Ctrl-C (issue 51, item 2), even when started as a
background job, which inherits SIGINT ignored (the new-user trial's Ctrl-C was ignored by the
accounting planner, the data generator and the worker): exit 130 within seconds, one line
saying what was kept, nothing half-written."""

import os
import signal
import subprocess
import sys
import time

import portpicker
import pytest

from run_helpers import REPO
from run_helpers import script_env

# Well under 2 s on idle cores; the bound leaves room for a suite's load (as test_interruptions).
STOP_SECONDS = 10


def _ignoring_sigint():
  signal.signal(signal.SIGINT, signal.SIG_IGN)   # As a shell's background job starts.


def _catches_sigint(pid: int) -> bool:
  """Whether process `pid` has installed a SIGINT handler (its /proc status SigCgt mask)."""
  with open(f'/proc/{pid}/status') as f:
    caught = next(l for l in f if l.startswith('SigCgt:')).split()[1]
  return bool(int(caught, 16) & (1 << (signal.SIGINT - 1)))


def _interrupt(args, after, cwd=REPO, ready=None, stream='stdout'):
  """Starts `python args` with SIGINT ignored and sends SIGINT once the command is under way:
  once a line of `stream` contains `ready`, or else once it handles SIGINT (its start-up imports
  done, however loaded the machine), then `after` seconds more. Returns (return code, stderr,
  seconds to stop)."""
  proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=script_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=_ignoring_sigint)
  if ready is not None:
    for line in getattr(proc, stream):
      if ready in line:
        break
  else:
    deadline = time.monotonic() + 120
    while not _catches_sigint(proc.pid):
      assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
      time.sleep(0.05)
  time.sleep(after)
  assert proc.poll() is None, proc.communicate()
  return _ctrl_c(proc, args)


def _ctrl_c(proc, what) -> tuple[int, str, float]:
  """Sends SIGINT to `proc`; (return code, stderr, seconds to stop), within 30 s."""
  proc.send_signal(signal.SIGINT)
  start = time.monotonic()
  try:
    _, err = proc.communicate(timeout=30)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.communicate()
    raise AssertionError(f'{what} ignored SIGINT for 30 s')
  return proc.returncode, err, time.monotonic() - start


@pytest.mark.slow   # Subprocesses and waits: not in `make test-fast`.
def test_the_planner_stops_at_the_first_ctrl_c(tmp_path):
  code, err, seconds = _interrupt(
      ['-m', 'tff_dp.accounting', '--plan', '--rounds=100000', '--population=1000000',
       '--delta=1e-7', '--plan_noise_multipliers=0.5,0.8,1,1.5', '--clients_per_round=5000',
       f'--plan_output={tmp_path / "plan.png"}'], after=1)
  assert code == 130 and 'stopped by SIGINT' in err, err
  assert seconds < STOP_SECONDS and not os.path.exists(tmp_path / 'plan.png')


@pytest.mark.slow   # Subprocesses and waits: not in `make test-fast`.
def test_the_worker_stops_at_the_first_ctrl_c():
  port = portpicker.pick_unused_port()
  code, _, seconds = _interrupt(['-m', 'tff_dp.worker', f'--port={port}'], after=1,
                                ready='serving on port')
  assert code in (130, -signal.SIGINT) and seconds < STOP_SECONDS, code


@pytest.mark.slow   # An arm's run: not in `make test-fast`.
def test_reproduce_stops_its_arm_at_the_first_ctrl_c_and_starts_no_later_one(tmp_path):
  """The trial: each Ctrl-C to reproduce.py (or its group) stopped one arm and the next started.
  A terminal's Ctrl-C reaches reproduce.py alone (each arm has its own process group); it
  stops the arm as a run stops, with its completed rounds kept, and ends the table."""
  root = tmp_path / 'tables'
  proc = subprocess.Popen(
      [sys.executable, 'reproduce.py', '--table=andrew2021_emnist', '--scale=smoke',
       '--arms=fixed_clip0.1,fixed_clip0.3', f'--root_output_dir={root}',
       '--extra_flags=--total_rounds=200'],
      cwd=REPO, env=script_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      start_new_session=True)
  seen = []
  for line in proc.stdout:   # The first arm under way: its round 1 done.
    seen.append(line)
    if 'round    1/200' in line:
      break
  assert proc.poll() is None, ''.join(seen) + proc.stderr.read()
  os.killpg(proc.pid, signal.SIGINT)   # As a terminal sends it: to the foreground group.
  start = time.monotonic()
  try:
    out, err = proc.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f'still running 60 s after the signal: {"".join(seen)}')
  seconds = time.monotonic() - start
  assert proc.returncode == 130, err[-2000:]
  assert 'stopped by SIGINT (Ctrl-C): the arm under way kept its completed rounds' in err, err
  assert seconds < STOP_SECONDS + 5, seconds   # The arm finishes its round first.
  runs = [d for d in os.listdir(root / 'andrew2021_emnist-smoke' / 'runs')]
  assert len(runs) == 1 and runs[0].startswith('fixed_clip0.1'), runs   # No later arm.
  arm = root / 'andrew2021_emnist-smoke' / 'runs' / runs[0]
  assert os.path.exists(arm / 'ledger.jsonl') and not os.path.exists(arm / 'summary.json')


@pytest.mark.slow   # Subprocesses and waits: not in `make test-fast`.
@pytest.mark.parametrize('when', ['starting', 'writing'])
def test_the_data_generator_stops_at_the_first_ctrl_c_and_leaves_no_partial_file(tmp_path, when):
  """The trial: Ctrl-C ignored, exit 0 after 21 s; then, on a loaded machine, a SIGINT once
  its handler was installed still ran on for over 30 s (a KeyboardInterrupt raised inside
  TensorFlow's import or proto code can be swallowed). Now: ended at once while it imports
  TensorFlow, and, while it writes, stopped at its next client or SQLite step."""
  cache = tmp_path / 'cache'
  proc = subprocess.Popen(
      [sys.executable, '-m', 'tasks.synthetic_data', '--family=emnist', '--population=3000',
       f'--cache_dir={cache}'], cwd=REPO, env=script_env(), text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_ignoring_sigint)
  deadline = time.monotonic() + 120
  while not (_catches_sigint(proc.pid) if when == 'starting'
             else cache.exists() and any(p.suffix == '.tmp' for p in cache.iterdir())):
    assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
    time.sleep(0.02)
  code, err, seconds = _ctrl_c(proc, 'the data generator')
  assert code == 130 and seconds < STOP_SECONDS, (code, seconds, err)
  last = err.strip().splitlines()[-1]   # After its progress line, if it got that far.
  assert 'Traceback' not in err and last.startswith(('interrupted: ', 'stopped by ')), err
  left = sorted(p.name for p in cache.iterdir()) if cache.exists() else []
  assert not [n for n in left if n.endswith('.tmp') or n.endswith('.sqlite')], left
