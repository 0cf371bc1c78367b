"""End-to-end DP-FedAvg runs through the real TFF loaders on generated TFF-format caches."""

import os
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow_federated as tff

import tasks
from tasks import synthetic_data
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp.accounting import accountant as accountant_lib
from tff_dp.execution import runtime
from tff_dp.training import config as config_lib
from tff_dp.training import experiment
from run_helpers import main_in_process
from run_helpers import metrics_rows
from run_helpers import script
from run_helpers import script_env


# Small but learnable settings per task (the word task: a small vocabulary and LSTM, to stay fast).
TASK_OPTIONS = {
    'emnist': dict(only_digits=True),
    'stackoverflow_word': dict(vocab_size=200, sequence_length=10, embedding_size=32,
                               latent_size=64),
    'stackoverflow_tag': dict(word_vocab_size=200, tag_vocab_size=20),
}
LEARNING_RATES = {'emnist': 0.05, 'stackoverflow_word': 0.5, 'stackoverflow_tag': 0.5}


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('tff_cache'))
  for name in tasks.TASK_NAMES:
    synthetic_data.ensure_default_cache(path, name)
  return path


def _task(name, data_dir):
  return tasks.build_task(name, data_dir, client_batch_size=10, max_elements_per_client=60,
                          shuffle_seed=0, **TASK_OPTIONS[name])


@pytest.mark.slow
@pytest.mark.parametrize('task_name', tasks.TASK_NAMES)
def test_three_round_dp_fedavg_learns_with_zero_noise(task_name, data_dir, tmp_path):
  cfg = config_lib.ExperimentConfig.from_settings(
      root_output_dir=str(tmp_path), experiment_name='e2e', task=task_name, total_rounds=3,
      clients_per_round=8, client_sampling='fixed_size', dp='fixed', clip=10.0,
      noise_multiplier=0.0, client_learning_rate=LEARNING_RATES[task_name],
      server_momentum=0.0, max_eval_examples=200)
  summary = experiment.run(cfg, _task(task_name, data_dir), log=lambda s: None)
  rows = metrics_rows(summary.run_dir)
  assert [int(r['round']) for r in rows] == [1, 2, 3]
  losses = [float(r['train_loss']) for r in rows]
  assert losses[-1] < losses[0], losses
  records = ledger_lib.read_ledger(os.path.join(summary.run_dir, 'ledger.jsonl'))
  assert [r.round_num for r in records] == [1, 2, 3]
  assert all(q.l2_norm_clip == pytest.approx(10.0) for r in records for q in r.queries)
  for plot in ('epsilon_vs_round.png', 'clip_vs_round.png', 'accuracy_vs_epsilon.png'):
    assert os.path.getsize(os.path.join(summary.run_dir, 'plots', plot)) > 1000


@pytest.mark.slow
@pytest.mark.parametrize('task_name', tasks.TASK_NAMES)
def test_clip_is_honoured_per_client(task_name, data_dir):
  """One client per round, server SGD lr 1: the model delta is that client's clipped update."""
  task = _task(task_name, data_dir)
  clip = 0.05
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      model_aggregator=mechanisms.build_aggregator(
          'fixed', noise_multiplier=0.0, clients_per_round=1.0, clip=clip))
  unclipped = tff.learning.algorithms.build_unweighted_fed_avg(
      task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0))
  for cid in list(task.train_data.client_ids)[:3]:
    ds = task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))
    state, raw_state = process.initialize(), unclipped.initialize()
    before = process.get_model_weights(state).trainable
    after = process.get_model_weights(process.next(state, [ds]).state).trainable
    raw_after = unclipped.get_model_weights(unclipped.next(raw_state, [ds]).state).trainable
    delta = np.sqrt(sum(np.sum((np.asarray(a) - np.asarray(b))**2)
                        for a, b in zip(after, before)))
    raw_delta = np.sqrt(sum(np.sum((np.asarray(a) - np.asarray(b))**2)
                            for a, b in zip(raw_after, before)))
    assert raw_delta > clip, 'test needs an update larger than the clip'
    assert delta <= clip * (1 + 1e-4)
    assert delta == pytest.approx(clip, rel=1e-3)


def _cli(args, log_path):
  log = open(log_path, 'a')
  return subprocess.Popen(script('run_experiment.py') + args,
                          stdout=log, stderr=subprocess.STDOUT, env=script_env())


@pytest.mark.slow
@pytest.mark.parametrize('dp', ['fixed', 'adaptive'])
def test_killed_run_resumes_with_identical_epsilon_curve(dp, data_dir, tmp_path):
  common = ['--task=emnist', '--emnist_only_digits', f'--data_dir={data_dir}',
            f'--dp={dp}', '--clip=0.5', '--noise_multiplier=0.2', '--clients_per_round=5',
            '--clipped_count_stddev=1.0', '--total_rounds=4', '--max_eval_examples=100',
            '--client_batch_size=10', '--max_elements_per_client=40', '--delta=1e-4',
            '--rounds_per_checkpoint=1', '--pld_every=1', f'--root_output_dir={tmp_path}']
  code, out, err = main_in_process('run_experiment.py', common + ['--experiment_name=full'])
  assert code == 0, out[-2000:] + err[-2000:]

  killed = _cli(common + ['--experiment_name=killed'], tmp_path / 'killed.log')
  metrics = tmp_path / 'killed' / 'metrics.csv'
  deadline = time.time() + 600
  while time.time() < deadline:
    if metrics.exists() and len(metrics.read_text().strip().splitlines()) >= 3:  # 2 rounds
      break
    time.sleep(0.2)
  workers = runtime.worker_pids(killed.pid)
  killed.send_signal(signal.SIGKILL)  # No cleanup at all: the hardest crash.
  killed.wait()
  for pid in workers:  # SIGKILL cannot be intercepted, so reap the orphaned worker here.
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  rows_at_kill = len(metrics_rows(tmp_path / 'killed'))
  assert 2 <= rows_at_kill < 4

  code, out, err = main_in_process('run_experiment.py',
                                   common + ['--experiment_name=killed', '--resume'])
  assert code == 0, (tmp_path / 'killed.log').read_text() + out[-2000:] + err[-2000:]

  full_rows, resumed_rows = metrics_rows(tmp_path / 'full'), metrics_rows(tmp_path / 'killed')
  assert [int(r['round']) for r in resumed_rows] == [1, 2, 3, 4]
  for key in ('epsilon_rdp', 'epsilon_pld'):
    resumed_eps = [float(r[key]) for r in resumed_rows]
    full_eps = [float(r[key]) for r in full_rows]
    if dp == 'fixed':
      # Same mechanism every round; only the floating-point summation order of the replay
      # on resume can differ.
      assert resumed_eps == pytest.approx(full_eps, rel=1e-10)
    else:
      # Adaptive clips differ between two runs (independent noise), so sigma/S differs in the
      # last float32 bits: equal to that resolution.
      assert resumed_eps == pytest.approx(full_eps, rel=2e-5)
  records = ledger_lib.read_ledger(str(tmp_path / 'killed' / 'ledger.jsonl'))
  assert [r.round_num for r in records] == [1, 2, 3, 4]
  # The replayed ledger gives the same curve as the one reported during the run.
  curve = accountant_lib.epsilon_curve(records, delta=1e-4, methods=('rdp',))
  assert [c['epsilon_rdp'] for c in curve] == pytest.approx(
      [float(r['epsilon_rdp']) for r in resumed_rows], rel=1e-9)
