"""Seconds per round for each task at demo scale, and DP-FedAvg vs plain FedAvg round time.

Prints ratios measured in one run (interleaved rounds so machine noise hits both arms alike).
Usage: python benchmarks/bench_rounds.py [--rounds 6] [--tasks emnist,stackoverflow_tag]
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

from tff_dp.execution import runtime as _runtime  # noqa: E402

_runtime.manage_workers()   # No TFF worker outlives the benchmark.

import bench_common  # noqa: E402
import tasks  # noqa: E402
from tasks import synthetic_data  # noqa: E402
from tff_dp import mechanisms  # noqa: E402

_TASK_OPTIONS = {
    'emnist': {},
    'stackoverflow_word': {},
    'stackoverflow_tag': {},
}


def bench_task(name, data_dir, clients, rounds):
  task = tasks.build_task(name, data_dir, client_batch_size=20, **_TASK_OPTIONS[name])
  datasets = [ds.cache() for ds in bench_common.first_client_datasets(task, clients)]
  arms = {
      'plain': bench_common.fed_avg(task.model_fn),
      'dp_fixed': bench_common.fed_avg(task.model_fn, mechanisms.build_aggregator(
          'fixed', noise_multiplier=0.5, clients_per_round=float(clients), clip=1.0)),
      'dp_adaptive': bench_common.fed_avg(task.model_fn, mechanisms.build_aggregator(
          'adaptive', noise_multiplier=0.5, clients_per_round=float(clients), clip=1.0)),
  }
  states = {k: p.initialize() for k, p in arms.items()}
  for k, p in arms.items():  # Warm-up: tracing and first-call costs are not round time.
    states[k] = p.next(states[k], datasets).state
  return bench_common.interleaved_median_seconds(arms, states, datasets, rounds)


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=1', '--clients=2', '--tasks=emnist']


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--rounds', type=int, default=6)
  parser.add_argument('--clients', type=int, default=10)
  parser.add_argument('--tasks', default='emnist,stackoverflow_tag,stackoverflow_word')
  args = bench_args.parse(parser, SMOKE)
  data_dir = os.path.join(tempfile.gettempdir(), 'tff_dp_bench_data')
  print(f'{"task":<20} {"plain s/round":>14} {"DP fixed":>10} {"DP adaptive":>12} '
        f'{"fixed/plain":>12} {"adaptive/plain":>15}')
  for name in args.tasks.split(','):
    synthetic_data.ensure_default_cache(data_dir, name)
    t = bench_task(name, data_dir, args.clients, args.rounds)
    print(f'{name:<20} {t["plain"]:>14.3f} {t["dp_fixed"]:>10.3f} {t["dp_adaptive"]:>12.3f} '
          f'{t["dp_fixed"] / t["plain"]:>12.3f} {t["dp_adaptive"] / t["plain"]:>15.3f}')


if __name__ == '__main__':
  main()
