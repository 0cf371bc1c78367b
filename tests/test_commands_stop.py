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

STOP_SECONDS = 3


def _ignoring_sigint():
  signal.signal(signal.SIGINT, signal.SIG_IGN)   # As a shell's background job starts.


def _interrupt(args, after, cwd=REPO, ready=None):
  """Starts `python args` with SIGINT ignored, sends SIGINT `after` seconds later (or once a
  stdout line contains `ready`, then `after` seconds); returns (return code, stderr, seconds to stop)."""
  proc = subprocess.Popen([sys.executable, *args], cwd=cwd, env=script_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=_ignoring_sigint)
  if ready is not None:
    for line in proc.stdout:
      if ready in line:
        break
  time.sleep(after)
  assert proc.poll() is None, proc.communicate()
  proc.send_signal(signal.SIGINT)
  start = time.monotonic()
  try:
    _, err = proc.communicate(timeout=30)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.communicate()
    raise AssertionError(f'{args} ignored SIGINT for 30 s')
  return proc.returncode, err, time.monotonic() - start


@pytest.mark.slow   # Subprocesses and waits: not in `make test-fast`.
def test_the_planner_stops_at_the_first_ctrl_c(tmp_path):
  code, err, seconds = _interrupt(
      ['-m', 'tff_dp.accounting', '--plan', '--rounds=100000', '--population=1000000',
       '--delta=1e-7', '--plan_noise_multipliers=0.5,0.8,1,1.5', '--clients_per_round=5000',
       f'--plan_output={tmp_path / "plan.png"}'], after=4)
  assert code == 130 and 'stopped by SIGINT' in err, err
  assert seconds < STOP_SECONDS and not os.path.exists(tmp_path / 'plan.png')


@pytest.mark.slow   # Subprocesses and waits: not in `make test-fast`.
def test_the_data_generator_stops_at_the_first_ctrl_c_and_leaves_no_partial_file(tmp_path):
  cache = tmp_path / 'cache'
  code, err, seconds = _interrupt(
      ['-m', 'tasks.synthetic_data', '--family=emnist', '--population=2000',
       f'--cache_dir={cache}'], after=8)   # Past its TensorFlow import (about 5 s).
  assert code == 130 and 'interrupted' in err, err
  assert seconds < STOP_SECONDS
  assert not [n for n in os.listdir(cache) if n.endswith('.tmp')] if cache.exists() else True


@pytest.mark.slow   # Subprocesses and waits: not in `make test-fast`.
def test_the_worker_stops_at_the_first_ctrl_c():
  port = portpicker.pick_unused_port()
  code, _, seconds = _interrupt(['-m', 'tff_dp.worker', f'--port={port}'], after=1,
                                ready='serving on port')
  assert code in (130, -signal.SIGINT) and seconds < STOP_SECONDS, code
