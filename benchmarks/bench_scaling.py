"""How round time grows with clients per round, and with TFF workers (loopback), measured.

EMNIST CNN with our flat adaptive DP aggregator in build_unweighted_fed_avg, 60 examples per
client (embedded data). Part 1: the local C++ context at 10, 50, 100 clients per round. Part 2:
50 clients per round on 1 and 2 remote workers started with `python -m tff_dp.worker` on this
machine (the mergeable execution context of `--workers`), against the local context.
Usage: python benchmarks/bench_scaling.py [--rounds 3]
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tff_dp  # noqa: E402,F401
import portpicker  # noqa: E402

import bench_common  # noqa: E402
import tasks  # noqa: E402
from tasks import synthetic_data  # noqa: E402
from tff_dp import aggregators  # noqa: E402
from tff_dp import distributed  # noqa: E402
from tff_dp import runtime  # noqa: E402


def _process(task, clients):
  return bench_common.fed_avg(
      task.model_fn, aggregators.build_dp_aggregator(
          'adaptive', noise_multiplier=0.5, clients_per_round=float(clients), clip=0.1),
      client_learning_rate=0.05)


def _seconds_per_round(task, clients, rounds):
  data = bench_common.first_client_datasets(task, clients)
  process = _process(task, clients)
  state = process.next(process.initialize(), data).state   # Warm-up: tracing, compilation.
  times = []
  for _ in range(rounds):
    t0 = time.perf_counter()
    state = process.next(state, data).state
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _start_worker():
  port = portpicker.pick_unused_port()
  env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  proc = subprocess.Popen([sys.executable, '-m', 'tff_dp.worker', f'--port={port}'], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  for _ in range(600):
    try:
      with socket.create_connection(('127.0.0.1', port), timeout=0.2):
        return proc, f'127.0.0.1:{port}'
    except OSError:
      time.sleep(0.1)
  raise RuntimeError('worker did not start')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args()
  data_dir = os.path.join(tempfile.gettempdir(), 'tff_dp_bench_data')
  synthetic_data.ensure_default_cache(data_dir, 'emnist')
  task = tasks.build_task('emnist', data_dir, client_batch_size=20)
  print(f'{os.cpu_count()} cores; EMNIST CNN, adaptive DP, 60 examples/client; median of '
        f'{args.rounds} rounds after a warm-up round')
  print(f'\n{"clients/round":>14} {"s/round":>8} {"s/client":>9}')
  for clients in (10, 50, 100):
    t = _seconds_per_round(task, clients, args.rounds)
    print(f'{clients:>14} {t:>8.2f} {t / clients:>9.3f}')

  print(f'\n50 clients/round{"":<12} {"s/round":>8}')
  local = _seconds_per_round(task, 50, args.rounds)
  print(f'{"local C++ context":<28} {local:>8.2f}')
  procs = []
  try:
    for n in (1, 2):
      while len(procs) < n:
        procs.append(_start_worker())
      distributed.install_worker_context([a for _, a in procs])
      t = _seconds_per_round(task, 50, args.rounds)
      print(f'{f"{n} remote worker(s), loopback":<28} {t:>8.2f}   x{t / local:.2f} of local')
  finally:
    runtime.configure_execution_context()
    for p, _ in procs:
      p.terminate()
      p.wait()


if __name__ == '__main__':
  main()
