"""Faults and bad input: NaN/Inf updates, bad client data, unwritable/full disk, signals, locks."""

import collections
import json
import os
import resource
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic_data
from tasks.base import FederatedTask
from tff_dp import aggregators
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp.aggregators.non_finite import NonFiniteZeroingFactory
from tff_dp.execution import runtime
from tff_dp.training import config as config_lib
from tff_dp.training import experiment
from tff_dp.training.run_state import run_dir as run_dir_lib
from run_helpers import main_in_process
from run_helpers import metrics_rows
from run_helpers import script
from run_helpers import script_env



def test_non_finite_update_is_zeroed_exactly_like_a_zero_update():
  value_type = tff.types.to_type([(np.float32, (3,)), (np.float32, (2,))])
  factory = NonFiniteZeroingFactory(mechanisms.build_aggregator(
      'adaptive', noise_multiplier=0.0, clients_per_round=3.0, clip=1.0,
      adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=0.0)))
  process = factory.create(value_type)
  good = [[np.full(3, 2.0, np.float32), np.ones(2, np.float32)],
          [np.full(3, 0.1, np.float32), np.zeros(2, np.float32)]]
  zero = [[np.zeros(3, np.float32), np.zeros(2, np.float32)]]
  for bad in ([np.array([np.nan, 1, 1], np.float32), np.ones(2, np.float32)],
              [np.ones(3, np.float32), np.array([np.inf, 0], np.float32)]):
    s_bad = s_zero = process.initialize()
    for _ in range(3):   # Three rounds: the clip estimate evolves identically.
      out_bad = process.next(s_bad, good + [bad])
      out_zero = process.next(s_zero, good + zero)
      s_bad, s_zero = out_bad.state, out_zero.state
      for a, b in zip(out_bad.result, out_zero.result):
        np.testing.assert_array_equal(a, b)
        assert np.all(np.isfinite(a))
      assert out_bad.measurements['non_finite_zeroed'] == 1
      assert out_zero.measurements['non_finite_zeroed'] == 0
      assert out_bad.measurements['zero_updates'] == out_zero.measurements['zero_updates'] == 1
      clip_bad = aggregators.find_privacy_queries(out_bad.measurements)[0].l2_norm_clip
      clip_zero = aggregators.find_privacy_queries(out_zero.measurements)[0].l2_norm_clip
      assert clip_bad == clip_zero and np.isfinite(clip_bad)


def _client(n, x_value=0.5, label=1):
  return collections.OrderedDict(x=np.full((n, 2), x_value, np.float32),
                                 y=np.full((n,), label, np.int32))


class _UnreadableClientData(tff.simulation.datasets.TestClientData):
  """Client 'unreadable' fails to build, as one client of a broken data source would."""

  def create_tf_dataset_for_client(self, client_id):
    if client_id == 'unreadable':
      raise OSError('disk I/O error')
    return super().create_tf_dataset_for_client(client_id)


def _tiny_task():
  clients = {f'good{i}': _client(8, 0.2 * (i + 1), i % 3) for i in range(3)}
  clients.update(empty=_client(0), nan_features=_client(8, np.nan), inf_features=_client(8, np.inf),
                 label_out_of_range=_client(8, 0.5, 7),
                 overflow=_client(8, 3e38, 1))   # Finite data, but the update overflows to NaN.
  clients.update(unreadable=_client(8))
  train = _UnreadableClientData(clients)
  test = tff.simulation.datasets.TestClientData({'t': _client(12, 0.4, 2)})
  batch = lambda ds: ds.map(lambda e: (e['x'], e['y'])).batch(4)  # noqa: E731

  def keras_model_fn():
    return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(2,)),
                                tf.keras.layers.Dense(3)])
  return FederatedTask(
      name='tiny', train_data=train, test_data=test, preprocess_train=batch,
      preprocess_eval=batch, keras_model_fn=keras_model_fn,
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')])


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_bad_client_data_and_diverged_updates_never_reach_the_model(tmp_path):
  task = _tiny_task()
  cfg = config_lib.ExperimentConfig.from_settings(
      root_output_dir=str(tmp_path), experiment_name='bad', total_rounds=3,
      clients_per_round=9, client_sampling='fixed_size', dp='adaptive', clip=1.0,
      noise_multiplier=0.1, clipped_count_stddev=1.0, client_learning_rate=0.1,
      accounting=('rdp',), delta=1e-3)
  log = []
  summary = experiment.run(cfg, task, log=log.append)
  rows = metrics_rows(tmp_path / 'bad')
  assert len(rows) == 3
  for row in rows:
    assert int(row['clients_rejected']) == 5   # empty, NaN, Inf, labels out of range, unreadable
    # The overflowing client: TFF's client work zeroes its NaN delta, we count it.
    assert int(row['aggregator/zero_updates']) == 1
    assert int(row['aggregator/non_finite_zeroed']) == 0
    assert np.isfinite(float(row['eval_loss'])) and np.isfinite(float(row['epsilon_rdp']))
    clip = [float(v) for k, v in row.items() if k.endswith('update/l2_norm_clip')]
    assert clip and all(np.isfinite(clip))
  weights = summary.final_state.global_model_weights.trainable
  assert all(np.all(np.isfinite(w)) for w in weights)
  messages = '\n'.join(log)
  for cid, reason in [('empty', 'empty dataset'), ('nan_features', 'NaN or Inf'),
                      ('label_out_of_range', 'integer labels/tokens outside [0, 3) (found 7)'),
                      ('unreadable', 'could not read its data (OSError: disk I/O error)')]:
    assert f'client {cid} skipped: {reason}' in messages
  assert len(ledger_lib.read_ledger(str(tmp_path / 'bad' / 'ledger.jsonl'))) == 3


def _cli(args, **kwargs):
  return subprocess.Popen(script('run_experiment.py') + args,
                          env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          **kwargs)


_COMMON = ['--task=emnist', '--emnist_only_digits', '--dp=fixed', '--clip=0.5',
           '--noise_multiplier=0.5', '--clients_per_round=5', '--max_eval_examples=100',
           '--client_batch_size=10', '--max_elements_per_client=30', '--delta=1e-3']


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_client_ids_with_quotes_train_through_the_cli(tmp_path):
  # TFF pastes client ids into SQL text: "o'brien" broke the query (a traceback in round 1,
  # and again on --resume) and "x' OR '1'='1" read every client's rows as its own.
  ids = ["o'brien", "x' OR '1'='1", 'zoë 数据', 'two  spaces', 'q' * 200]
  rng = np.random.default_rng(0)
  clients = {cid: [synthetic_data.emnist_example(rng.uniform(0, 1, (28, 28)), i)
                   for _ in range(3)] for i, cid in enumerate(ids)}
  synthetic_data.write_sqlite(str(tmp_path / 'data' / 'emnist_all.sqlite'), {
      split: clients for split in ('digits_only_train', 'digits_only_test', 'all_train',
                                   'all_test')})
  code, out, err = main_in_process('run_experiment.py', _COMMON + [
      f'--data_dir={tmp_path / "data"}', f'--root_output_dir={tmp_path}',
      '--experiment_name=ids', '--total_rounds=1', '--client_sampling=fixed_size',
      f'--clients_per_round={len(ids)}'])
  assert code == 0, err[-2000:]
  assert 'Traceback' not in err and 'skipped' not in out
  [row] = metrics_rows(tmp_path / 'ids')
  assert int(row['num_clients']) == len(ids) and not row.get('clients_rejected')
  assert np.isfinite(float(row['train_loss'])) and np.isfinite(float(row['eval_loss']))


def test_unwritable_output_dir_is_a_clear_error(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  code, _, err = main_in_process('run_experiment.py', _COMMON + [
      f'--root_output_dir={blocker}/runs', '--total_rounds=1'])
  assert code == 2
  errors_ = [l for l in err.splitlines() if l.startswith('error:')]
  assert len(errors_) == 1 and 'not writable' in errors_[0] and str(blocker) in errors_[0]
  assert 'Traceback' not in err


def test_a_second_run_on_the_same_directory_is_refused(tmp_path):
  holder = run_dir_lib.RunDirectory(str(tmp_path), 'exp', resume=False)
  holder.create()               # This process now owns tmp_path/exp (as a running run would).
  (tmp_path / 'exp' / 'ledger.jsonl').write_text('')
  before = sorted(os.listdir(tmp_path / 'exp'))
  proc = _cli(_COMMON + [f'--root_output_dir={tmp_path}', '--experiment_name=exp', '--resume',
                         '--total_rounds=1'])
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 2
  assert f'error: run directory {tmp_path}/exp is in use by pid {os.getpid()}' in err
  assert sorted(os.listdir(tmp_path / 'exp')) == before
  with pytest.raises(Exception, match='in use by pid'):
    run_dir_lib.RunDirectory(str(tmp_path), 'exp', resume=True)   # In-process too.


@pytest.mark.slow
def test_disk_full_mid_run_loses_nothing_and_resume_completes(tmp_path):
  def limit_file_size():   # Every write past 3 MB fails (EFBIG), like a full disk.
    resource.setrlimit(resource.RLIMIT_FSIZE, (3_000_000, 3_000_000))
  args = _COMMON + [f'--root_output_dir={tmp_path}', '--experiment_name=full',
                    '--total_rounds=4', '--rounds_per_checkpoint=2']
  proc = _cli(args, preexec_fn=limit_file_size)   # The 4.8 MB checkpoint of round 2 fails.
  out, err = proc.communicate(timeout=600)
  assert proc.returncode == 1, err
  lines = [l for l in err.splitlines() if l.startswith('error:')]
  assert len(lines) == 1 and 'could not write the outputs of round 2' in lines[0]
  assert 'File too large' in lines[0] and 'Traceback' not in err
  run = tmp_path / 'full'
  assert [r['round'] for r in metrics_rows(run)] == ['1']
  assert [r.round_num for r in ledger_lib.read_ledger(str(run / 'ledger.jsonl'))] == [1, 2]
  code, out, err = main_in_process('run_experiment.py', args + ['--resume'])
  assert code == 0, err
  assert [r['round'] for r in metrics_rows(run)] == ['1', '2', '3', '4']
  # Round 2 released nothing: its record is set aside and the round re-executed once. Round 1
  # had released metrics without a checkpoint: it stays counted and is counted again.
  assert [r.round_num for r in ledger_lib.read_ledger(str(run / 'ledger.jsonl'))] == [
      1, 1, 2, 3, 4]
  assert [r.round_num for r in ledger_lib.read_moved_records(
      str(run / 'ledger.unreleased.jsonl'))] == [2]
  assert json.loads((run / 'summary.json').read_text())['rounds_completed'] == 4


def _wait_for_line(proc, needle, timeout=300):
  deadline = time.time() + timeout
  seen = []
  while time.time() < deadline:
    line = proc.stdout.readline()
    if not line:
      break
    seen.append(line)
    if needle in line:
      return seen
  raise AssertionError(f'{needle!r} not seen; output: {"".join(seen)[-2000:]}')


@pytest.mark.slow
@pytest.mark.parametrize('how', ['sigterm', 'ctrl_c'])
def test_signal_mid_run_stops_with_consistent_checkpoint_and_ledger(how, tmp_path):
  args = _COMMON + [f'--root_output_dir={tmp_path}', '--experiment_name=sig',
                    '--total_rounds=6', '--rounds_per_checkpoint=10']
  proc = _cli(args, start_new_session=True)   # Its own process group, like a terminal job.
  _wait_for_line(proc, 'round    3/6')
  workers = runtime.worker_pids(proc.pid)
  if how == 'sigterm':
    proc.send_signal(signal.SIGTERM)
  else:   # Ctrl-C: the whole foreground group, worker_binary included, gets SIGINT.
    os.killpg(proc.pid, signal.SIGINT)
  out, err = proc.communicate(timeout=300)
  expected = signal.SIGTERM if how == 'sigterm' else signal.SIGINT
  assert proc.returncode == 128 + expected, err[-2000:]
  assert f'stopped by {expected.name} after round' in out
  done = int(out.split(f'stopped by {expected.name} after round ')[1].split(';')[0])
  assert 3 <= done < 6
  run = tmp_path / 'sig'
  assert [int(r['round']) for r in metrics_rows(run)] == list(range(1, done + 1))
  assert [r.round_num for r in ledger_lib.read_ledger(str(run / 'ledger.jsonl'))] == list(
      range(1, done + 1))
  assert os.path.isdir(run / 'checkpoints' / f'round_{done}')  # Although not a 10th round.
  assert not (run / 'summary.json').exists()
  time.sleep(0.5)
  assert not any(runtime._alive(p) for p in workers)  # pylint: disable=protected-access
  code, out, err = main_in_process('run_experiment.py', args + ['--resume'])
  assert code == 0, err[-2000:]
  assert f'resuming at round {done + 1}' in out
  assert [r.round_num for r in ledger_lib.read_ledger(str(run / 'ledger.jsonl'))] == list(
      range(1, 7))   # Every round counted exactly once: nothing re-executed.
