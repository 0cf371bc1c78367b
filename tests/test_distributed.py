"""--workers: a round's clients spread over TFF worker processes (loopback), faults, resume."""

import os
import signal
import socket
import subprocess
import sys
import time

import portpicker
import pytest

from tff_dp import distributed
from tff_dp import ledger as ledger_lib
from tff_dp.errors import UserInputError
from run_helpers import metrics_rows
from run_helpers import script
from run_helpers import script_env

_ENV = script_env()
# Logistic regression (no dropout) with seeded shuffles: bit-reproducible up to the float
# summation order of the cross-worker merge. Noise off, as the comparison needs.
_FLAGS = ['--task=stackoverflow_tag', '--dp=adaptive', '--clip=0.5', '--noise_multiplier=0',
          '--clipped_count_stddev=0', '--clients_per_round=6', '--client_sampling=fixed_size',
          '--max_eval_examples=200', '--client_batch_size=10', '--max_elements_per_client=30',
          '--client_learning_rate=1.0', '--rounds_per_checkpoint=10', '--delta=1e-3',
          '--sampling_seed=0']   # Reproducible samples: the runs are compared client by client.


class Worker:
  """`python -m tff_dp.worker --port P`, the helper users start on each host."""

  def __init__(self, port):
    self.port = port
    self.proc = None

  def start(self):
    self.proc = subprocess.Popen([sys.executable, '-m', 'tff_dp.worker', f'--port={self.port}'],
                                 env=_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
      assert self.proc.poll() is None, 'worker exited at start-up'
      try:
        with socket.create_connection(('127.0.0.1', self.port), timeout=0.2):
          return self
      except OSError:
        time.sleep(0.1)
    raise AssertionError(f'worker on {self.port} did not start')

  def cpu_seconds(self):
    with open(f'/proc/{self.proc.pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')

  def stop(self, sig=signal.SIGINT):
    if self.proc is not None and self.proc.poll() is None:
      self.proc.send_signal(sig)
      try:
        self.proc.wait(timeout=20)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def workers():
  started = [Worker(portpicker.pick_unused_port()).start() for _ in range(2)]
  yield started
  for w in started:
    w.stop()


def _run(args, timeout=900):
  proc = subprocess.run(script('run_experiment.py') + args,
                        env=_ENV, capture_output=True, text=True, timeout=timeout)
  return proc.returncode, proc.stdout, proc.stderr


_COMPARED = ('train_loss', 'eval_loss', 'eval_accuracy', 'eval_recall_at_5')


def _assert_same_training(rows_a, rows_b):
  assert [r['round'] for r in rows_a] == [r['round'] for r in rows_b]
  for a, b in zip(rows_a, rows_b):
    clip_keys = [k for k in a if k.endswith('update/l2_norm_clip')]
    assert clip_keys
    for k in _COMPARED + tuple(clip_keys):
      assert float(a[k]) == pytest.approx(float(b[k]), rel=1e-5, abs=1e-6), (a['round'], k)


def test_parse_workers():
  assert distributed.parse_workers('a:1, b.example.org:8000') == ['a:1', 'b.example.org:8000']
  for bad in ['', 'a', 'a:b', ':80', 'a:0', 'a:70000', 'a:1,a:1']:
    with pytest.raises(UserInputError, match='--workers'):
      distributed.parse_workers(bad)


def test_worker_helper_refuses_a_busy_port(workers):
  proc = subprocess.run([sys.executable, '-m', 'tff_dp.worker', f'--port={workers[0].port}'],
                        env=_ENV, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and f'port {workers[0].port} is not available' in proc.stderr


def test_worker_restarts_on_the_port_of_a_killed_worker():
  # A killed worker leaves its accepted connections closing (FIN_WAIT, then TIME_WAIT) on its
  # port for up to a minute; the helper must still start there (CI once failed here).
  worker = Worker(portpicker.pick_unused_port()).start()
  try:
    with socket.create_connection(('127.0.0.1', worker.port), timeout=5):
      time.sleep(0.3)   # Accepted by the server.
      worker.stop(signal.SIGKILL)
      worker.start()
      assert worker.proc.poll() is None
  finally:
    worker.stop()


def test_unreachable_worker_is_a_clear_error(tmp_path):
  port = portpicker.pick_unused_port()
  code, _, err = _run(_FLAGS + ['--total_rounds=1', f'--root_output_dir={tmp_path}',
                                f'--workers=127.0.0.1:{port}', '--worker_unavailable_timeout=3'])
  assert code == 2
  assert f'error: no TFF worker answers at 127.0.0.1:{port}' in err
  assert 'Traceback' not in err and not os.listdir(tmp_path)


@pytest.mark.slow
def test_two_workers_match_the_single_process_run_and_survive_a_killed_worker(workers, tmp_path):
  addresses = ','.join(f'127.0.0.1:{w.port}' for w in workers)
  common = _FLAGS + [f'--root_output_dir={tmp_path}', '--total_rounds=6']
  code, _, err = _run(common + ['--experiment_name=local'])
  assert code == 0, err[-2000:]

  cpu_before = [w.cpu_seconds() for w in workers]
  code, _, err = _run(common + ['--experiment_name=spread', f'--workers={addresses}'])
  assert code == 0, err[-2000:]
  _assert_same_training(metrics_rows(tmp_path / 'local'), metrics_rows(tmp_path / 'spread'))
  # Both workers trained clients (the split is by contiguous client slices).
  assert all(w.cpu_seconds() - c > 0.5 for w, c in zip(workers, cpu_before))

  # Kill one worker in the middle of a run: the round fails with a clear error and writes
  # nothing; --resume finishes the run once the worker is back, with the same results.
  proc = subprocess.Popen(
      script('run_experiment.py') + common + [
          '--experiment_name=killed', f'--workers={addresses}',
          '--worker_unavailable_timeout=5'],
      env=_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  seen = ''
  while 'round    3/6' not in seen:
    line = proc.stdout.readline()
    assert line, seen + proc.stderr.read()
    seen += line
  workers[1].stop(signal.SIGKILL)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 1, out + err
  errors = [l for l in err.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and f'worker 127.0.0.1:{workers[1].port} unreachable' in errors[0]
  assert 'Rerun with --resume' in errors[0] and 'Traceback' not in err
  failed = int(errors[0].split('error: round ')[1].split()[0])
  assert failed >= 4
  run = tmp_path / 'killed'
  done = list(range(1, failed))
  assert [int(r['round']) for r in metrics_rows(run)] == done
  assert [r.round_num for r in ledger_lib.read_ledger(str(run / 'ledger.jsonl'))] == done
  assert sorted(os.listdir(run / 'checkpoints')) == [f'round_{failed - 1}']  # Not round 10.

  workers[1].start()   # Back on the same port.
  code, out, err = _run(common + ['--experiment_name=killed', f'--workers={addresses}',
                                  '--resume'])
  assert code == 0, err[-2000:]
  assert f'resuming at round {failed}' in out
  assert [r.round_num for r in ledger_lib.read_ledger(str(run / 'ledger.jsonl'))] == list(
      range(1, 7))
  _assert_same_training(metrics_rows(tmp_path / 'local'), metrics_rows(run))
