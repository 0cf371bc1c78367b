"""A quiet library (issue 37.9): `tff_dp.run` holds back TensorFlow's, gRPC's and absl's C++ log
lines while it lasts and forwards everything else; `native_logs=True` shows them. Oracles: the
record formats of those loggers (written here by hand, and TensorFlow's own lines in a real
run), file-descriptor identity before and after, and a child that outlives the block."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import run_helpers

TF_RECORD = ('2026-11-25 23:56:33.699724: E tensorflow/core/grappler/grappler_item_builder.cc:'
             '435] Failed to detect the fetch node(s), skipping this input')
ABSL_RECORD = 'I0000 00:00:1764115000.123456   12345 fork_posix.cc:77] Other threads are ' \
              'currently calling into gRPC, skipping fork() handlers'


def _python(code: str, env=None, timeout=60) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True,
                        text=True, timeout=timeout, cwd=run_helpers.REPO,
                        env=env or dict(os.environ, PYTHONPATH=run_helpers.REPO))


def test_native_records_are_dropped_and_other_lines_forwarded_in_order_then_stderr_is_back():
  done = _python(f"""
      import os, sys
      from tff_dp.execution import native_logs
      before = os.fstat(2)
      print('python before', file=sys.stderr)
      with native_logs.held_back():
        os.write(2, b'{TF_RECORD}\\n' + b'c-level line\\n{ABSL_RECORD}\\n')
        print('python inside', file=sys.stderr, flush=True)
        os.write(2, b'To enable the following instructions: AVX2, in other operations, '
                    b'rebuild TensorFlow with the appropriate compiler flags.\\n')
        os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are '
                    b'written to STDERR\\npartial ')
        os.write(2, b'line\\n')
        assert native_logs.real_stderr_fd() is not None
      assert native_logs.real_stderr_fd() is None
      after = os.fstat(2)
      assert (before.st_ino, before.st_dev) == (after.st_ino, after.st_dev)
      os.write(2, b'{TF_RECORD}\\n')   # Outside the block: shown.
      """)
  assert done.returncode == 0, done.stderr
  assert done.stderr.splitlines() == ['python before', 'c-level line', 'python inside',
                                      'partial line', TF_RECORD]


def test_disabled_it_changes_nothing():
  done = _python(f"""
      import os
      from tff_dp.execution import native_logs
      with native_logs.held_back(False):
        os.write(2, b'{TF_RECORD}\\n')
        assert native_logs.real_stderr_fd() is None
      """)
  assert done.stderr.splitlines() == [TF_RECORD]


def test_a_child_given_the_real_stderr_outlives_the_block_and_is_heard():
  done = _python("""
      import subprocess, sys, time
      from tff_dp.execution import native_logs
      with native_logs.held_back():
        late = 'import time, sys; time.sleep(1); print("child", file=sys.stderr)'
        child = subprocess.Popen([sys.executable, '-c', late],
                                 stderr=native_logs.real_stderr_fd())
        start = time.monotonic()
      assert time.monotonic() - start < 1, 'the block waited for the child'
      child.wait()
      """)
  assert done.returncode == 0, done.stderr
  assert done.stderr.splitlines() == ['child']


def test_a_worker_started_as_tff_starts_it_does_not_hold_the_block_open():
  """TFF starts its worker with stderr=sys.stderr: the worker kept the block's pipe, and a run
  stopped before its first round waited out the forwarder's 5 s before ending (a CI run's
  SIGTERM test went over its 10 s)."""
  done = _python("""
      import sys, time
      from tff_dp.execution import native_logs, runtime
      with native_logs.held_back():
        late = 'import time, sys; time.sleep(3); print("worker", file=sys.stderr)'
        worker = runtime.WorkerPopen([sys.executable, '-c', late], stdout=sys.stdout,
                                     stderr=sys.stderr)   # As TFF's executor factory does.
        start = time.monotonic()
      assert time.monotonic() - start < 2, 'the block waited for the worker'
      worker.wait()
      """)
  assert done.returncode == 0, done.stderr
  assert done.stderr.splitlines() == ['worker']


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_run_through_the_api_prints_only_its_own_lines_unless_asked():
  """One process, two runs of a 12-client task: held back (default), then `native_logs=True`,
  which shows TensorFlow's own records (the proof that there were some to hold back). The
  task's module imports TensorFlow first: its import-time lines are the caller's own."""
  env = {k: v for k, v in os.environ.items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  env['PYTHONPATH'] = run_helpers.REPO
  done = _python("""
      import sys, tempfile
      import tff_dp
      from tests import test_user_task
      from tff_dp.training import config
      root = tempfile.mkdtemp()
      print('task imported', file=sys.stderr, flush=True)
      for native in (False, True):
        cfg = test_user_task._config(root).replace(native_logs=native, total_rounds=1,
                                                   experiment_name=f'native_{native}')
        tff_dp.run(cfg, task=test_user_task.TwoClassTask(), log=print)
        print(f'end of run native_logs={native}', file=sys.stderr, flush=True)
      """, env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  quiet, _, loud = done.stderr.partition('task imported\n')[2].partition(
      'end of run native_logs=False\n')
  assert quiet == '', quiet[:2000]
  assert 'round    1/1' in done.stdout
  assert any(' tensorflow/' in line and '] ' in line for line in loud.splitlines()), loud[:2000]


@pytest.mark.slow   # Two command lines: not in `make test-fast`.
def test_the_documented_line_silences_tensorflows_own_lines_for_a_pipeline():
  """README and docs/PYTHON_API.md tell a pipeline user to start Python with
  TF_CPP_MIN_LOG_LEVEL=2 (issue 51, item 6): with it, importing TensorFlow and running an op
  prints no native record; without it, it does (so the check can fail)."""
  from tff_dp.execution import native_logs  # pylint: disable=g-import-not-at-top
  program = 'import tensorflow as tf; print(float(tf.reduce_sum(tf.ones([3]))))'

  def native_lines(env):
    done = subprocess.run([sys.executable, '-c', program], env=env, capture_output=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == b'3.0', done.stderr[-2000:]
    return [l for l in done.stderr.splitlines() if native_logs.is_native_record(l)]
  env = {k: v for k, v in run_helpers.script_env().items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  assert native_lines(env)
  assert native_lines(dict(env, TF_CPP_MIN_LOG_LEVEL='2')) == []
