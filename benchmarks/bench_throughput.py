"""Our full DP round vs the same round in plain TFF without DP (issue 7 target: <= 1.2x).

Plain TFF: `tff.simulation.baselines.emnist.create_character_recognition_task` (cnn_dropout,
batch 20, one epoch) on the same SQLite cache, `sample_train_clients(10)` and
`build_unweighted_fed_avg(...).next` per round: what a TFF user writes without DP.
Ours: `tff_dp.training.experiment.run` with flat adaptive DP clipping, Poisson-free fixed-size
sampling of 10 clients, ledger + RDP/PLD accounting, metrics CSV, TensorBoard and a checkpoint
every round; the per-round wall time (`wall_seconds` in metrics.csv: the whole round, not just
the TFF call). 10 clients x 100 examples per round (`--clients`, `--examples`). Arms run
plain / ours / plain and the ratio uses the mean of both plain medians, so machine drift hits
both sides.

Usage: python benchmarks/bench_throughput.py [--rounds 12] [--max_concurrent_computation_calls N]
"""

import argparse
import csv
import os
import random
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

import tasks  # noqa: E402
from tasks import synthetic_data  # noqa: E402
from tff_dp.execution import runtime  # noqa: E402

runtime.manage_workers()   # No TFF worker outlives the benchmark.
from tff_dp.training import config as config_lib  # noqa: E402
from tff_dp.training import experiment  # noqa: E402

def _data_dir(examples: int) -> str:
  path = os.path.join(tempfile.gettempdir(), f'tff_dp_bench_throughput_{examples}')
  if not os.path.exists(os.path.join(path, 'emnist_all.sqlite')):
    os.makedirs(path, exist_ok=True)
    synthetic_data.write_emnist_cache(path, num_train_clients=100,
                                      examples_per_client=examples, num_test_clients=5)
  return path


def plain_tff_seconds(data_dir: str, rounds: int, clients: int) -> list[float]:
  spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=20)
  task = tff.simulation.baselines.emnist.create_character_recognition_task(
      spec, model_id='cnn_dropout', only_digits=False, cache_dir=data_dir)
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.05),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9))
  state = process.initialize()
  rng = random.Random(0)
  ids = list(task.datasets.train_data.client_ids)
  times = []
  for _ in range(rounds + 1):
    t0 = time.perf_counter()
    data = [task.datasets.train_preprocess_fn(task.datasets.train_data.create_tf_dataset_for_client(c))
            for c in rng.sample(ids, clients)]
    state = process.next(state, data).state
    times.append(time.perf_counter() - t0)
  return times[1:]  # The first round includes tracing.


def ours_seconds(data_dir: str, rounds: int, clients: int, **overrides) -> list[float]:
  task = tasks.build_task('emnist', data_dir, client_batch_size=20, only_digits=False)
  root = tempfile.mkdtemp(prefix='tff_dp_bench_')  # A fresh run directory per arm.
  cfg = config_lib.ExperimentConfig.from_settings(
      root_output_dir=root, experiment_name='ours', total_rounds=rounds + 1,
      clients_per_round=clients, client_sampling='fixed_size', client_learning_rate=0.05,
      dp='adaptive', clip=0.1, noise_multiplier=0.5, rounds_per_eval=10**6,
      max_eval_examples=200, **overrides)
  experiment.run(cfg, task, log=lambda _: None)
  with open(os.path.join(root, 'ours', 'metrics.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  # Drop round 1 (tracing) and the last round (the final evaluation).
  return [float(r['wall_seconds']) for r in rows[1:-1]]


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=2', '--clients=2', '--examples=20']


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=12)
  parser.add_argument('--clients', type=int, default=10, help='clients per round')
  parser.add_argument('--examples', type=int, default=100, help='examples per client')
  parser.add_argument('--max_concurrent_computation_calls', type=int, default=None,
                      help='Set the C++ context concurrency (default: tff_dp\'s setting).')
  args = bench_args.parse(parser, SMOKE)
  if args.max_concurrent_computation_calls is not None:
    runtime.configure_execution_context(
        max_concurrent_computation_calls=args.max_concurrent_computation_calls)
  data_dir, clients = _data_dir(args.examples), args.clients
  # Means, not medians: the periodic PLD report and checkpoint are part of the round cost.
  plain1 = statistics.mean(plain_tff_seconds(data_dir, args.rounds, clients))
  ours = statistics.mean(ours_seconds(data_dir, args.rounds, clients))
  no_cache = statistics.mean(ours_seconds(data_dir, args.rounds, clients, client_cache_size=0,
                                          prefetch_clients=False))
  ckpt1 = statistics.mean(ours_seconds(data_dir, args.rounds, clients, rounds_per_checkpoint=1,
                                       pld_every=1))
  runtime.configure_execution_context(max_concurrent_computation_calls=1)
  serial = statistics.mean(ours_seconds(data_dir, args.rounds, clients))
  runtime.configure_execution_context(
      max_concurrent_computation_calls=args.max_concurrent_computation_calls or -1)
  plain2 = statistics.mean(plain_tff_seconds(data_dir, args.rounds, clients))
  plain = (plain1 + plain2) / 2
  print(f'{"arm (mean wall s/round)":<66} {"s/round":>8} {"/plain":>7}')
  print(f'{"plain TFF, no DP (first / last arm)":<66} {plain1:>8.3f} / {plain2:.3f}')
  for name, t in [('tff_dp defaults: adaptive DP, ledger, RDP, PLD/10, ckpt/10', ours),
                  ('  same, no client-data cache/prefetch', no_cache),
                  ('  same, checkpoint + PLD every round', ckpt1),
                  ('  same, one client at a time (max_concurrent_computation_calls=1)', serial)]:
    print(f'{name:<66} {t:>8.3f} {t / plain:>7.3f}')
  print(f'ratio ours (defaults) / plain TFF: {ours / plain:.3f}  (target <= 1.2; '
        f'{clients} clients x {args.examples} examples, {os.cpu_count()} cores, '
        f'TF inter-op threads {tf.config.threading.get_inter_op_parallelism_threads()})')


if __name__ == '__main__':
  main()
