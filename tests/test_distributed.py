"""--workers: a round's clients spread over TFF worker processes (loopback), faults, resume."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import portpicker
import pytest

from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp.errors import UserInputError
from tff_dp.execution import distributed
from tff_dp.execution import runtime
from run_helpers import main_in_process
from run_helpers import metrics_rows
from run_helpers import script
from run_helpers import script_env

_ENV = script_env()
# Logistic regression (no dropout) with seeded shuffles: bit-reproducible up to the float
# summation order of the cross-worker merge. Noise off, as the comparison needs. A small model
# (1,000 words, 50 tags; the default is 10,000 x 500): what is spread over workers is the same.
_FLAGS = ['--task=stackoverflow_tag', '--so_vocab_size=1000', '--so_tag_vocab_size=50',
          '--dp=adaptive', '--clip=0.5', '--noise_multiplier=0',
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

  def stop(self, sig=signal.SIGTERM):
    # SIGTERM, not Ctrl-C's SIGINT: a suite started in the background (`make test &`, CI
    # scripts) inherits SIGINT ignored, and so does the worker, which then waited out the 20 s
    # below on every stop.
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
  # A process of its own: in this one, a run installing its TFF context would stop the test's
  # workers (they are this process's worker_binary children, see runtime.shutdown_workers).
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
    with pytest.raises(UserInputError, match='`workers`'):
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
  code, _, err = main_in_process('run_experiment.py', _FLAGS + [
      '--total_rounds=1', f'--root_output_dir={tmp_path}', f'--workers=127.0.0.1:{port}',
      '--worker_unavailable_timeout=3'])
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
  used = [w.cpu_seconds() - c for w, c in zip(workers, cpu_before)]
  assert all(u > 0.5 for u in used), used

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


def _linear_fed_avg_and_clients(clients=8, examples=3000, features=64):
  """A softmax regression FedAvg with our adaptive DP aggregator (noise off) and fixed client
  datasets: enough work per client that a worker's slice computes for a noticeable time."""
  import tensorflow as tf   # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff   # pylint: disable=g-import-not-at-top
  from tff_dp import aggregators   # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  datasets = []
  for _ in range(clients):
    x = rng.normal(size=(examples, features)).astype(np.float32)
    y = rng.integers(0, 10, size=(examples, 1)).astype(np.int32)
    datasets.append(tf.data.Dataset.from_tensor_slices((x, y)).batch(10))
  spec = datasets[0].element_spec

  def model_fn():
    keras_model = tf.keras.Sequential([tf.keras.layers.Dense(
        10, input_shape=(features,), kernel_initializer='zeros')])
    return tff.learning.models.from_keras_model(
        keras_model, input_spec=spec,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.01),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      model_aggregator=mechanisms.build_aggregator(
          'adaptive', noise_multiplier=0.0,
          clients_per_round=float(clients), clip=0.5,
          adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=0.0)))
  return process, datasets


@pytest.mark.slow
def test_workers_compute_their_slices_at_the_same_time(monkeypatch):
  # Each worker's first CreateCall of a round (its up_to_merge: the worker_binary trains its
  # slice's clients inside that call) waits, before it is sent, until the other worker's has
  # been issued too. Workers driven one after the other never get there (the first waits in
  # vain, TFF 0.87's stub calls block the one event loop); concurrent ones always do, however
  # loaded the machine. The calls' intervals are recorded as well, to show they overlap.
  calls, rendezvous = [], {}
  plain_call = distributed._FailFastStub._call   # pylint: disable=protected-access

  def recorded_call(stub, method, request):
    address = stub._address   # pylint: disable=protected-access
    if method == 'create_call' and address in rendezvous['pending']:
      rendezvous['pending'].discard(address)
      try:
        rendezvous['barrier'].wait()
        rendezvous['met'].append(address)
      except threading.BrokenBarrierError:
        pass
    start = time.monotonic()
    try:
      return plain_call(stub, method, request)
    finally:
      calls.append((address, method, start, time.monotonic()))

  monkeypatch.setattr(distributed._FailFastStub, '_call', recorded_call)  # pylint: disable=protected-access
  process, datasets = _linear_fed_avg_and_clients()
  runtime.configure_execution_context()
  state = process.initialize()
  local = process.next(state, datasets)
  # Started after the local run: installing a local context stops this process's workers.
  workers = []
  try:
    workers += [Worker(portpicker.pick_unused_port()).start() for _ in range(2)]
    addresses = [f'127.0.0.1:{w.port}' for w in workers]
    distributed.install_worker_context(addresses)
    for _ in range(2):   # The first round also builds the executors on the workers.
      del calls[:]
      rendezvous.update(pending=set(addresses), met=[],
                        barrier=threading.Barrier(len(addresses), timeout=30))
      spread = process.next(state, datasets)
  finally:
    for w in workers:
      w.stop()
    runtime.configure_execution_context()

  assert sorted(rendezvous['met']) == sorted(addresses)
  first, second = ([(s, e) for a, m, s, e in calls if a == address and m == 'create_call'][0]
                   for address in addresses)
  assert min(first[1], second[1]) > max(first[0], second[0]), (first, second)   # Overlap.

  # And the round's result is the single-process one (noise off; float summation order).
  for w_local, w_spread in zip(process.get_model_weights(local.state).trainable,
                               process.get_model_weights(spread.state).trainable):
    np.testing.assert_allclose(w_spread, w_local, rtol=1e-5, atol=1e-6)
  assert not np.allclose(process.get_model_weights(local.state).trainable[0], 0)   # Trained.
