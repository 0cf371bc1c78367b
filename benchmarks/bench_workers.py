"""Do two TFF workers, each on its own core, run a round faster than one? Measured on loopback.

20-client EMNIST rounds (TFF's EMNIST CNN, our flat adaptive DP aggregator with noise off,
embedded data) through `--workers`' mergeable execution context. The workers are started with
`python -m tff_dp.worker` under `taskset`: the 1-worker baseline on core 0, the 2-worker arm on
cores 0 and 1 (the coordinator, this process, is not pinned). Prints seconds per round of each
arm, the workers' CPU seconds per second of round (the cores they got), the slices in flight
(seconds the coordinator waits in workers' CreateCall/Compute, summed over workers, per second
of round: above 1 only if the workers run at the same time), the speedup, and the largest
absolute difference of the resulting model weights from the single-process run (TFF's local
C++ context) of the same round.

To compare weight for weight, the CNN's dropout rate is set to 0 (TFF draws the masks unseeded
inside each worker, so a dropout round is not reproducible even locally) and the client shuffle
is seeded; the compute is the same CNN's. Every timed round is the same round (same state and
clients) and the arms alternate, so machine load hits both alike.
Usage: python benchmarks/bench_workers.py [--rounds 5] [--clients 20]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

import bench_common  # noqa: E402
import tasks  # noqa: E402
from tasks import synthetic_data  # noqa: E402
from tff_dp import aggregators  # noqa: E402
from tff_dp import mechanisms  # noqa: E402
from tff_dp.execution import distributed  # noqa: E402
from tff_dp.execution import runtime  # noqa: E402

runtime.manage_workers()   # No TFF worker outlives the benchmark.



def _without_dropout(keras_model_fn):
  def build():
    model = keras_model_fn()
    for layer in model.layers:
      if isinstance(layer, tf.keras.layers.Dropout):
        layer.rate = 0.0   # Keras then returns its input unchanged.
    return model
  return build


def _process(task, clients):
  def model_fn():
    return tff.learning.models.from_keras_model(
        _without_dropout(task.keras_model_fn)(), loss=task.loss_fn(),
        input_spec=task.input_spec)
  return bench_common.fed_avg(
      model_fn, mechanisms.build_aggregator(
          'adaptive', noise_multiplier=0.0,
          clients_per_round=float(clients), clip=0.1,
          adaptive=aggregators.AdaptiveClipping(clipped_count_stddev=0.0)),
      client_learning_rate=0.05)


class _CallTimer:
  """Seconds the coordinator spends inside workers' CreateCall/Compute (the slices' training):
  summed over the workers, per second of round, it is how many slices were in flight on
  average (at most 1 if the workers ran one after the other)."""

  def __init__(self):
    self.seconds = 0.0
    plain = distributed._FailFastStub._call   # pylint: disable=protected-access
    timer = self

    def timed(stub, method, request):
      t0 = time.perf_counter()
      try:
        return plain(stub, method, request)
      finally:
        if method in ('create_call', 'compute'):
          timer.seconds += time.perf_counter() - t0
    distributed._FailFastStub._call = timed   # pylint: disable=protected-access


def _weights(process, state):
  return [np.asarray(w) for w in process.get_model_weights(state).trainable]


def _load():
  return ' '.join(f'{x:.2f}' for x in os.getloadavg())


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=1', '--clients=2']


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--clients', type=int, default=20)
  args = bench_args.parse(parser, SMOKE)
  if shutil.which('taskset') is None or os.cpu_count() < 2:
    sys.exit('needs taskset and at least 2 cores')
  data_dir = os.path.join(tempfile.gettempdir(), 'tff_dp_bench_data')
  synthetic_data.ensure_default_cache(data_dir, 'emnist')
  task = tasks.build_task('emnist', data_dir, client_batch_size=20, shuffle_seed=0)
  data = bench_common.first_client_datasets(task, args.clients)
  process = _process(task, args.clients)
  print(f'{os.cpu_count()} cores, load average {_load()} (shared machine: timings are noisy); '
        f'EMNIST CNN (dropout 0), adaptive DP noise off, {args.clients} clients/round; median '
        f'of {args.rounds} rounds per arm after 3 warm-up rounds, arms alternating')

  runtime.configure_execution_context()
  state = process.initialize()
  local = _weights(process, process.next(state, data).state)
  # Same round again: how reproducible is the local context itself?
  local_again = _weights(process, process.next(state, data).state)
  runtime.shutdown_workers()   # The local context's worker: not competing with the timed arms.

  procs, arms = [], {}
  try:
    procs = [bench_common.start_worker(0), bench_common.start_worker(1)]
    addresses = [a for _, a in procs]
    arms['1 worker (core 0)'] = distributed.install_worker_context(addresses[:1])
    arms['2 workers (cores 0, 1)'] = distributed.install_worker_context(addresses)
    times, cpu, diffs = {k: [] for k in arms}, {k: [] for k in arms}, {}
    in_calls, timer = {k: 0.0 for k in arms}, _CallTimer()
    # Warm-up: executors and compilation on the workers. Three rounds: merge and after_merge run
    # on whichever worker finishes last, and each worker's context compiles them once.
    for name in bench_common.rotating_order(list(arms), 3):
      tff.framework.set_default_context(arms[name])
      diffs[name] = max(float(np.max(np.abs(a - b)))
                        for a, b in zip(_weights(process, process.next(state, data).state),
                                        local))
    for name in bench_common.rotating_order(list(arms), args.rounds):
      tff.framework.set_default_context(arms[name])
      cpu0 = sum(runtime.cpu_seconds(p.pid) for p, _ in procs)
      calls0 = timer.seconds
      t0 = time.perf_counter()
      process.next(state, data)
      times[name].append(time.perf_counter() - t0)
      in_calls[name] += timer.seconds - calls0
      cpu[name].append(sum(runtime.cpu_seconds(p.pid) for p, _ in procs) - cpu0)
  finally:
    runtime.configure_execution_context()
    runtime.shutdown_workers()
    for p, _ in procs:
      p.terminate()
      p.wait()

  medians = {k: statistics.median(v) for k, v in times.items()}
  # Worker CPU seconds per wall second of the round: the cores the workers actually got (at
  # most 1 and 2 here); below that when other programs share the cores.
  print(f'\n{"":<24} {"s/round":>8} {"min":>6} {"max":>6} {"worker cores":>13} '
        f'{"slices in flight":>17} {"max |w - w_local|":>18}')
  for name in arms:
    cores = sum(cpu[name]) / sum(times[name])
    in_flight = in_calls[name] / sum(times[name])
    print(f'{name:<24} {medians[name]:>8.2f} {min(times[name]):>6.2f} {max(times[name]):>6.2f} '
          f'{cores:>13.2f} {in_flight:>17.2f} {diffs[name]:>18.2e}')
  local_diff = max(float(np.max(np.abs(a - b))) for a, b in zip(local_again, local))
  print(f'{"local context, again":<24} {"":>8} {"":>6} {"":>6} {"":>13} {"":>17} '
        f'{local_diff:>18.2e}')
  one, two = medians['1 worker (core 0)'], medians['2 workers (cores 0, 1)']
  print(f'\nspeedup 2 workers vs 1: x{one / two:.2f} (median s/round); load average now '
        f'{_load()}')


if __name__ == '__main__':
  main()
