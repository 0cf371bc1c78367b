"""Rounds close to the compute (issue 13.2): our whole round against the raw client work and
against plain TFF, interleaved in one process.

Arms, on the same clients every repetition (the first N of the task; client batch 20, one
epoch, client SGD lr 0.1):
  raw           the client work in plain TF: a `tf.function` SGD step per batch over each
                client's dataset, weights reset per client, deltas summed (the floor).
  tff           `tff.learning.algorithms.build_unweighted_fed_avg` with TFF's defaults (its
                DatasetReduce client loop, mean aggregation), server SGD lr 1 momentum 0.9.
  tff_iterator  the same with `loop_implementation=DATASET_ITERATOR` (where TFF's time goes).
  ours          one round of the loop run_experiment.py runs (`experiment.run` with its
                defaults: DP adaptive clipping wrapped as there, fixed-size sampling of all N
                clients, client-data cache, ledger append, RDP every round and PLD every 10th,
                metrics row, TensorBoard, console line); no eval or checkpoint round is timed.
Our round is timed inside the real loop: the loop's console line ends each round, so the
benchmark's `log` callback runs the other arms between two of our rounds (in the rotating
order of `bench_common.rotating_order`) and our round is the time from the end of one
callback to the next. `ours_next` is the part of it spent getting the client datasets and in
`process.next` (`round_seconds` in metrics.csv); the rest is the loop's Python work.
Targets (issue 40): ours/raw <= 1.15, ours/tff <= 0.75.

Usage: python benchmarks/bench_limit.py [--tasks emnist,stackoverflow_word]
         [--clients 10,100] [--repetitions 5] [--arms raw,tff,tff_iterator,ours]
         [--ours_loop dataset_reduce]   (our client loop; default: run_experiment.py's)
Quick check: --tasks emnist --clients 10 --repetitions 3
"""

import argparse
import collections
import csv
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Optional

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

import bench_common  # noqa: E402
import tasks  # noqa: E402
from tasks import synthetic_data  # noqa: E402
from tff_dp.execution import runtime  # noqa: E402

runtime.manage_workers()   # No TFF worker outlives the benchmark.
from tff_dp import choices  # noqa: E402
from tff_dp.run_format import console  # noqa: E402
from tff_dp.training import config as config_lib  # noqa: E402
from tff_dp.training import experiment  # noqa: E402

ARMS = ('raw', 'tff', 'tff_iterator', 'ours')
_LEARNING_RATE = 0.1
_BATCH = 20
# Examples per client: 100 for EMNIST as in the measurement; 40 (the embedded default)
# for StackOverflow. 100 clients of each, so 100 clients per round fit in the population.
_SIZES = {'emnist': 100, 'stackoverflow_word': 40}


def _cpu_seconds() -> float:
  """CPU seconds used so far by this process and its live TFF worker (where clients train).

  Reported beside wall time: on a shared machine a round's wall time depends on the load,
  its CPU time much less (a multi-threaded arm also gets a larger share of a loaded machine).
  """
  workers = [runtime.cpu_seconds(pid) for pid in runtime.worker_pids()]
  return time.process_time() + sum(s for s in workers if not math.isnan(s))   # nan: gone.


class _Clock:
  """Wall and CPU seconds of each arm's repetitions."""

  def __init__(self, arms):
    self.wall = {k: [] for k in arms}
    self.cpu = {k: [] for k in arms}
    self._mark = (0.0, 0.0)

  def mark(self):
    self._mark = (time.perf_counter(), _cpu_seconds())

  def record(self, arm):
    self.wall[arm].append(time.perf_counter() - self._mark[0])
    self.cpu[arm].append(_cpu_seconds() - self._mark[1])

  def run(self, arm, step):
    self.mark()
    step()
    self.record(arm)


class _Done(Exception):
  """Raised from the log callback to leave `experiment.run` after the last timed round."""


def _data_dir(task_name: str) -> str:
  """The embedded synthetic data, at 100 clients (the default caches hold 60 or 100)."""
  family = 'emnist' if task_name == 'emnist' else 'stackoverflow'
  path = os.path.join(tempfile.gettempdir(), f'tff_dp_bench_limit_{family}')
  marker = os.path.join(path, 'done')
  if not os.path.exists(marker):
    os.makedirs(path, exist_ok=True)
    if family == 'emnist':
      synthetic_data.write_emnist_cache(path, num_train_clients=100,
                                        examples_per_client=_SIZES['emnist'], num_test_clients=5)
    else:
      synthetic_data.write_stackoverflow_cache(
          path, num_train_clients=100, examples_per_client=_SIZES['stackoverflow_word'],
          num_test_clients=5)
    open(marker, 'w').close()
  return path


class RawClientWork:
  """The client work of a round in plain TF: what TFF's client computation does, minus TFF."""

  def __init__(self, task, element_spec):
    self._model = task.keras_model_fn()
    loss_fn = task.loss_fn()
    variables = self._model.trainable_variables
    initial = [tf.Variable(v) for v in variables]
    total = [tf.Variable(tf.zeros_like(v)) for v in variables]

    @tf.function(input_signature=[element_spec])
    def step(batch):
      x, y = (batch['x'], batch['y']) if isinstance(batch, collections.abc.Mapping) else batch
      with tf.GradientTape() as tape:
        loss = loss_fn(y, self._model(x, training=True))
      for v, g in zip(variables, tape.gradient(loss, variables)):
        if isinstance(g, tf.IndexedSlices):   # Embeddings: a sparse update, as Keras SGD does.
          v.scatter_sub(tf.IndexedSlices(_LEARNING_RATE * g.values, g.indices))
        else:
          v.assign_sub(_LEARNING_RATE * g)

    @tf.function
    def reset():
      for v, v0 in zip(variables, initial):
        v.assign(v0)

    @tf.function
    def accumulate():
      for s, v, v0 in zip(total, variables, initial):
        s.assign_add(v - v0)

    self._step, self._reset, self._accumulate, self._total = step, reset, accumulate, total

  def run(self, datasets):
    for s in self._total:
      s.assign(tf.zeros_like(s))
    for ds in datasets:
      self._reset()
      for batch in ds:
        self._step(batch)
      self._accumulate()
    return [s.numpy() for s in self._total]   # Read out, as a server would.


def _ours_config(task_name: str, clients: int, root: str, client_cache_size: int,
                 loop_implementation: Optional[str]) -> config_lib.ExperimentConfig:
  """run_experiment.py's defaults, sampling all `clients` clients every round."""
  return config_lib.ExperimentConfig.from_settings(
      root_output_dir=root, experiment_name=f'{task_name}-{clients}',
      client_cache_size=client_cache_size, task=task_name, client_batch_size=_BATCH,
      total_rounds=10**6, rounds_per_eval=10**6, rounds_per_checkpoint=10**6,
      clients_per_round=clients, max_train_clients=clients, client_sampling='fixed_size',
      client_learning_rate=_LEARNING_RATE, dp='adaptive', clip=0.1, noise_multiplier=0.5,
      **({} if loop_implementation is None else {'loop_implementation': loop_implementation}))


def bench(task_name: str, clients: int, repetitions: int, arms: list, warmup: int,
          client_cache_size: int, ours_loop: Optional[str]) -> dict:
  """A `_Clock` of every arm's repetitions; its wall times also hold 'ours_next'."""
  task = tasks.build_task(task_name, _data_dir(task_name), client_batch_size=_BATCH,
                          shuffle_seed=0)
  datasets = bench_common.first_client_datasets(task, clients)
  processes = {
      'tff': bench_common.fed_avg(task.model_fn, client_learning_rate=_LEARNING_RATE),
      'tff_iterator': tff.learning.algorithms.build_unweighted_fed_avg(
          task.model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(_LEARNING_RATE),
          server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
          loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR),
  }
  processes = {k: p for k, p in processes.items() if k in arms}
  states = {k: p.initialize() for k, p in processes.items()}
  steps = {}

  def set_up_others():
    # Built now, after every TFF process (ours included) was traced: TFF traces model_fn in a
    # tf.compat.v1.Graph, which invalidates Keras models built before it.
    if 'raw' in arms:
      raw = RawClientWork(task, datasets[0].element_spec)
      steps['raw'] = lambda: raw.run(datasets)
    for k, process in processes.items():
      def step(k=k, process=process):
        states[k] = process.next(states[k], datasets).state
      steps[k] = step
    for _ in range(warmup):   # Tracing and first-call costs are not round time.
      for step in steps.values():
        step()

  clock = _Clock(arms)
  if 'ours' not in arms:
    set_up_others()
    for k in bench_common.rotating_order(list(arms), repetitions):
      clock.run(k, steps[k])
    return clock

  # What runs between two of our rounds: segments[i] after our round i (round 0: the warm-up).
  segments = [[]]
  for k in bench_common.rotating_order(list(arms), repetitions):
    if k == 'ours':
      segments.append([])
    else:
      segments[-1].append(k)
  rounds = [0]

  def log(line):
    if console.parse_round_line(line) is None:
      return
    i = rounds[0]
    if i >= warmup:
      clock.record('ours')
    elif i == warmup - 1:
      set_up_others()
    if i >= warmup - 1:
      for k in segments[i - warmup + 1]:
        clock.run(k, steps[k])
      if i - warmup + 1 == repetitions:
        raise _Done
    rounds[0] = i + 1
    clock.mark()

  root = tempfile.mkdtemp(prefix='bench_limit_')
  try:
    cfg = _ours_config(task_name, clients, root, client_cache_size, ours_loop)
    try:
      experiment.run(cfg, task, log=log)
    except _Done:
      pass
    with open(os.path.join(root, cfg.output.experiment_name, 'metrics.csv'), newline='') as f:
      rows = list(csv.DictReader(f))[warmup:]
    clock.wall['ours_next'] = [float(r['round_seconds']) for r in rows]
  finally:
    shutil.rmtree(root, ignore_errors=True)
  return clock


def _table(title, results, columns, arms):
  ratios = [a for a in ('raw', 'tff') if a in arms and 'ours' in arms]
  print(f'\n{title}\n{"task":<19} {"clients":>7} ' + ' '.join(f'{a:>12}' for a in columns)
        + ''.join(f' {"ours/" + a:>9}' for a in ratios))
  for (name, clients), times in results:
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f'{name:<19} {clients:>7} ' + ' '.join(f'{med[a]:>12.3f}' for a in columns)
          + ''.join(f' {med["ours"] / med[a]:>9.3f}' for a in ratios))


def _cores_table(results, arms):
  """Cores each arm keeps busy: its median CPU seconds over its median wall seconds (our wall
  time beats TFF's only if we use the cores it uses)."""
  print('\ncores used (median CPU s / median wall s)\n'
        f'{"task":<19} {"clients":>7} ' + ' '.join(f'{a:>12}' for a in arms))
  for (name, clients), clock in results:
    cores = {a: statistics.median(clock.cpu[a]) / statistics.median(clock.wall[a])
             for a in arms}
    print(f'{name:<19} {clients:>7} ' + ' '.join(f'{cores[a]:>12.2f}' for a in arms))


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--tasks=emnist', '--clients=2', '--repetitions=1', '--warmup=1']


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--tasks', default='emnist,stackoverflow_word')
  parser.add_argument('--clients', default='10,100', help='Clients per round, comma-separated.')
  parser.add_argument('--repetitions', type=int, default=5)
  parser.add_argument('--warmup', type=int, default=1, help='Untimed rounds of every arm first.')
  parser.add_argument('--arms', default=','.join(ARMS))
  parser.add_argument('--client_cache_size', type=int, default=1000,
                      help='Ours: 0 rebuilds and checks every client dataset every round.')
  parser.add_argument('--ours_loop', default=None, choices=sorted(choices.LOOP_IMPLEMENTATIONS),
                      help='Ours: the client loop (default: run_experiment.py\'s).')
  parser.add_argument('--max_concurrent_computation_calls', type=int, default=-1,
                      help='Clients the TFF worker trains at once, for every TFF arm '
                           '(<= 0: all of a round\'s clients, TFF\'s default).')
  args = bench_args.parse(parser, SMOKE)
  arms = [a for a in ARMS if a in args.arms.split(',')]
  if set(args.arms.split(',')) - set(ARMS) or args.warmup < 1 or args.repetitions < 1:
    parser.error(f'--arms from {",".join(ARMS)}; --warmup and --repetitions >= 1')
  runtime.configure_execution_context(   # As run_experiment.py does.
      max_concurrent_computation_calls=args.max_concurrent_computation_calls)
  print(f'{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start (a shared '
        f'machine: figures are indicative); median of {args.repetitions} interleaved '
        f'repetitions after {args.warmup} warm-up; TFF {tff.__version__}; '
        f'max_concurrent_computation_calls {args.max_concurrent_computation_calls}; our '
        f'client loop {args.ours_loop or "that of run_experiment.py"}', flush=True)
  results = []
  for name in args.tasks.split(','):
    for clients in (int(c) for c in args.clients.split(',')):
      results.append(((name, clients), bench(name, clients, args.repetitions, arms,
                                             args.warmup, args.client_cache_size,
                                             args.ours_loop)))
      print(f'  {name} x {clients} done, load average {os.getloadavg()[0]:.1f}', flush=True)
  _table('wall seconds per round', [(k, c.wall) for k, c in results],
         arms + (['ours_next'] if 'ours' in arms else []), arms)
  _table('CPU seconds per round (this process + its TFF worker)',
         [(k, c.cpu) for k, c in results], arms, arms)
  _cores_table(results, arms)
  print('\ntargets: ours/raw <= 1.15, ours/tff <= 0.8 (wall)')


if __name__ == '__main__':
  main()
