"""Scaling table (issue 13.7): seconds per round and peak RSS at 10, 100 and 500 clients per round.

Each cell is one `run_experiment.py` subprocess, exactly as a user runs it: the task's model, our
flat adaptive DP aggregator (z = 0.3), fixed-size samples of `clients_per_round` clients from a
generated TFF-format cache of `--population` clients (the generator of the embedded data, written
once into `--cache_dir`), no evaluation, `--total_rounds` rounds. Seconds per round are the
median of the console's `round_seconds` over the rounds after the first (the first traces and
compiles). Peak RSS is sampled from /proc every 0.2 s: the run_experiment.py process (the
coordinator), its TFF `worker_binary`, and their sum at the same instant.

`--max_concurrent CLIENTS:CAP,...` passes `--max_concurrent_computation_calls=CAP` to the cells
with that many clients per round, and `--client_slices CLIENTS:K,...` passes `--client_slices=K`
(the two memory bounds for large rounds; a cap of 100 at 500 EMNIST clients left TFF's worker
idle and the round never finished, see docs/ENGINEERING_NOTES.md, so slices are the bound that works). One
vs two loopback workers is measured by `bench_workers.py` (each worker pinned to its own core).
Usage: python benchmarks/bench_scaling.py [--clients 10,100,500] [--tasks emnist,stackoverflow_word]
           [--total_rounds 3] [--max_concurrent 500:100] [--client_slices 500:5]
"""

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench_args  # noqa: E402  (no TensorFlow)

from tff_dp.execution import runtime  # noqa: E402  (/proc helpers only; imports no TensorFlow)
from tff_dp.run_format import console  # noqa: E402  (imports no TensorFlow)

# Examples per client of the generated caches: a StackOverflow client of the real dataset has a
# median of ~30 sentences, EMNIST ~200 characters; fewer here keep a 500-client round in minutes.
_EXAMPLES_PER_CLIENT = {'emnist': 40, 'stackoverflow_word': 10}


class PeakRss:
  """Samples the RSS of a process and of its TFF workers every `interval` s, keeping peaks."""

  def __init__(self, pid: int, interval: float = 0.2):
    self.coordinator = self.worker = self.total = 0
    self._pid, self._interval = pid, interval
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._sample, daemon=True)
    self._thread.start()

  def _sample(self):
    while not self._done.is_set():
      c = runtime.rss_mib(self._pid)
      w = sum(runtime.rss_mib(p) for p in runtime.worker_pids(self._pid))
      if not (math.isnan(c) or math.isnan(w)):   # nan: gone between listing and reading.
        self.coordinator, self.worker = max(self.coordinator, c), max(self.worker, w)
        self.total = max(self.total, c + w)
      self._done.wait(self._interval)

  def stop(self):
    self._done.set()
    self._thread.join()


def _cache(cache_dir: str, task: str, population: int) -> str:
  """A TFF-format cache of `population` training clients (written once, then reused)."""
  from tasks import synthetic_data  # pylint: disable=g-import-not-at-top
  path = os.path.join(cache_dir, f'{task.split("_")[0]}-{population}')
  done = os.path.join(path, '.complete')
  if not os.path.exists(done):
    os.makedirs(path, exist_ok=True)
    write = (synthetic_data.write_emnist_cache if task == 'emnist'
             else synthetic_data.write_stackoverflow_cache)
    write(path, num_train_clients=population, examples_per_client=_EXAMPLES_PER_CLIENT[task],
          num_test_clients=4)
    open(done, 'w').close()
  return path


def run_cell(task: str, data_dir: str, clients: int, rounds: int, cap: int,
             slices: int) -> dict:
  out_dir = tempfile.mkdtemp(prefix='bench_scaling-')
  cmd = [sys.executable, os.path.join(ROOT, 'run_experiment.py'), f'--task={task}',
         f'--data_dir={data_dir}', '--dp=adaptive', '--clip=0.1', '--noise_multiplier=0.3',
         f'--clients_per_round={clients}', '--client_sampling=fixed_size',
         f'--total_rounds={rounds}', f'--rounds_per_eval={rounds + 1}',
         f'--rounds_per_checkpoint={rounds}', f'--max_concurrent_computation_calls={cap}',
         f'--client_slices={slices}',
         '--sampling_seed=0', f'--root_output_dir={out_dir}', '--experiment_name=scaling']
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  seconds, tail = {}, []
  start = time.monotonic()
  with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        env=env, cwd=ROOT) as proc:
    peak = PeakRss(proc.pid)
    for line in proc.stdout:
      tail = (tail + [line.rstrip()])[-5:]
      round_line = console.parse_round_line(line)
      if round_line is not None and round_line.round_seconds is not None:
        seconds[round_line.round_num] = round_line.round_seconds
    peak.stop()
  if proc.returncode != 0 or len(seconds) < rounds:
    raise RuntimeError(f'{task} at {clients} clients failed ({proc.returncode}):\n' +
                       '\n'.join(tail))
  later = [s for r, s in seconds.items() if r > 1] or list(seconds.values())
  return dict(s_per_round=statistics.median(later), first_round=seconds[1],
              wall=time.monotonic() - start, coordinator_gib=peak.coordinator / 1024,
              worker_gib=peak.worker / 1024, total_gib=peak.total / 1024)


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--tasks=emnist', '--clients=2', '--population=20', '--total_rounds=2']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--tasks', default='emnist,stackoverflow_word')
  parser.add_argument('--clients', default='10,100,500')
  parser.add_argument('--population', type=int, default=1000)
  parser.add_argument('--total_rounds', type=int, default=3)
  parser.add_argument('--max_concurrent', default='',
                      help='CLIENTS:CAP,... e.g. 500:100 (default: no cap anywhere).')
  parser.add_argument('--cache_dir', default=os.path.join(tempfile.gettempdir(),
                                                          'tff_dp_bench_scaling'))
  parser.add_argument('--client_slices', default='',
                      help='CLIENTS:SLICES,... e.g. 500:5 (default: one slice everywhere).')
  args = bench_args.parse(parser, SMOKE)
  clients = [int(c) for c in args.clients.split(',')]
  per_clients = lambda spec: {int(k): int(v) for k, v in (kv.split(':')
                                                           for kv in spec.split(',') if kv)}
  caps, slices = per_clients(args.max_concurrent), per_clients(args.client_slices)
  if args.total_rounds < 2 or max(clients) > args.population:
    parser.error('--total_rounds must be >= 2 and every --clients <= --population')
  print(f'{os.cpu_count()} cores; adaptive DP z=0.3, fixed-size samples from {args.population} '
        f'clients; s/round = median of rounds 2..{args.total_rounds}; peak RSS sampled every '
        '0.2 s', flush=True)
  print(f'\n{"task":<20} {"clients":>7} {"cap":>5} {"slices":>6} {"ex/client":>9} {"s/round":>8} '
        f'{"s/client":>8} {"round 1 s":>9} {"coord GiB":>9} {"worker GiB":>10} '
        f'{"sum GiB":>8}', flush=True)
  for task in args.tasks.split(','):
    data_dir = _cache(args.cache_dir, task, args.population)
    for n in clients:
      cap = caps.get(n, -1)
      r = run_cell(task, data_dir, n, args.total_rounds, cap, slices.get(n, 1))
      print(f'{task:<20} {n:>7} {cap if cap > 0 else "-":>5} {slices.get(n, 1):>6} '
            f'{_EXAMPLES_PER_CLIENT[task]:>9} '
            f'{r["s_per_round"]:>8.2f} {r["s_per_round"] / n:>8.3f} {r["first_round"]:>9.1f} '
            f'{r["coordinator_gib"]:>9.2f} {r["worker_gib"]:>10.2f} {r["total_gib"]:>8.2f}',
            flush=True)


if __name__ == '__main__':
  main()
