"""No TFF worker_binary survives a program that used TFF: normal exit, exception, SIGTERM."""

import signal
import subprocess
import sys
import time

import pytest

from tff_dp import runtime
from run_helpers import script_env


_PROGRAM = r'''
import sys, time
import tff_dp
import tensorflow as tf, tensorflow_federated as tff
@tff.tensorflow.computation(tf.int32)
def add_one(x):
  return x + 1
print('result', add_one(41), flush=True)
mode = sys.argv[1]
if mode == 'raise':
  raise RuntimeError('boom')
if mode == 'wait':
  time.sleep(600)
'''


def _all_worker_pids() -> set[int]:
  """Leaked workers on the machine (orphans); workers of other live programs do not count."""
  return set(runtime.orphaned_worker_pids())


def _start(mode):
  return subprocess.Popen([sys.executable, '-c', _PROGRAM, mode], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, env=script_env(), text=True)


@pytest.mark.parametrize('mode', ['exit', 'raise'])
def test_pipe_closes_and_no_worker_survives(mode):
  before = _all_worker_pids()
  proc = _start(mode)
  # communicate() only returns once every holder of the stdout pipe is gone: a leaked worker
  # (which inherits stdout) would make this time out.
  out, _ = proc.communicate(timeout=180)
  assert 'result 42' in out
  assert proc.returncode == (0 if mode == 'exit' else 1)
  time.sleep(0.5)
  assert _all_worker_pids() - before == set()


def test_sigterm_stops_worker():
  before = _all_worker_pids()
  proc = _start('wait')
  assert 'result 42' in proc.stdout.readline()
  children = runtime.worker_pids(proc.pid)
  assert len(children) == 1, 'the program should have started exactly one worker'
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=60)
  assert proc.returncode != 0
  time.sleep(0.5)
  assert not runtime._alive(children[0])
  assert _all_worker_pids() - before == set()
