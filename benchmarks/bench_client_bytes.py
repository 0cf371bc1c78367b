"""Bytes the coordinator sends to a TFF worker per round: serialized datasets vs client ids.

One loopback worker (`python -m tff_dp.worker`, the `--workers` path), a gRPC interceptor on
the coordinator's channel counting every request's and response's serialized size. Each task
runs the real loop (`experiment.run`) twice with the same sampled clients (fixed-size, seeded):
`datasets_on_workers=False` (each client's dataset graph serialized into the round) and `True`
(client ids; the task's dataset computation builds the datasets on the worker). A round's bytes
are the counter's growth between two console lines of the loop; round 1 (initialize) and the
last round (model read for evaluation) are left out. `create_value` requests are also split
by what they carry (the computation itself is sent with every call).

Usage: python benchmarks/bench_client_bytes.py [--rounds 4] [--clients 10]
"""

import argparse
import collections
import os
import statistics
import sys
import tempfile
import threading

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

import grpc  # noqa: E402

from tff_dp.execution import runtime as _runtime  # noqa: E402

_runtime.manage_workers()   # No TFF worker outlives the benchmark.
import bench_common  # noqa: E402  (its loopback worker helper)
import tasks  # noqa: E402
from tasks import synthetic_data  # noqa: E402
from tff_dp.execution import distributed  # noqa: E402
from tff_dp.run_format import console  # noqa: E402
from tff_dp.training import config as config_lib  # noqa: E402
from tff_dp.training import experiment  # noqa: E402


class ByteCounter(grpc.UnaryUnaryClientInterceptor):
  """Serialized bytes of every request (by method, and by value kind for create_value) and
  every response on the channels it intercepts."""

  def __init__(self):
    self._lock = threading.Lock()
    self.sent = collections.Counter()
    self.received = 0

  def intercept_unary_unary(self, continuation, details, request):
    method = details.method.rsplit('/', 1)[-1]
    if method == 'CreateValue':
      method += ':' + (request.value.WhichOneof('value') or '?')
    with self._lock:
      self.sent[method] += request.ByteSize()
    response = continuation(details, request)
    try:
      size = response.result().ByteSize()
    except Exception:  # pylint: disable=broad-except
      size = 0   # A failed call: the stub raises it.
    with self._lock:
      self.received += size
    return response

  def snapshot(self):
    with self._lock:
      return collections.Counter(self.sent), self.received


def _task(name, data_dir):
  if name == 'emnist':
    synthetic_data.write_emnist_cache(data_dir, num_train_clients=30, examples_per_client=30)
    return tasks.build_task('emnist', data_dir, client_batch_size=20, shuffle_seed=0)
  synthetic_data.write_stackoverflow_cache(data_dir, num_train_clients=30,
                                           examples_per_client=20)
  return tasks.build_task('stackoverflow_word', data_dir, client_batch_size=16, shuffle_seed=0,
                          max_elements_per_client=64)   # The paper-scale 10,000-word vocab.


def _measure(task, counter, root, name, rounds, clients, on_workers):
  snapshots = []

  def log(line):
    if console.parse_round_line(line) is not None or line.startswith('run directory:'):
      snapshots.append(counter.snapshot())

  cfg = config_lib.ExperimentConfig.from_settings(
      root_output_dir=root, experiment_name=name, task=task.name, total_rounds=rounds, seed=0,
      clients_per_round=clients, client_sampling='fixed_size', sampling_seed=0,
      dp='adaptive', clip=0.1, noise_multiplier=0.5, accounting=('rdp',),
      rounds_per_eval=rounds, max_eval_examples=100, datasets_on_workers=on_workers)
  experiment.run(cfg, task, log=log)
  # snapshots[0]: before initialize; snapshots[r]: after round r. Rounds 2 .. rounds-1.
  per_round = []
  for r in range(2, rounds):
    (sent_a, recv_a), (sent_b, recv_b) = snapshots[r - 1], snapshots[r]
    per_round.append((sent_b - sent_a, recv_b - recv_a))
  return per_round


def _fmt(n):
  return f'{n / 1e6:8.3f} MB' if n >= 1e5 else f'{n / 1e3:8.1f} kB'


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=3', '--clients=2', '--tasks=emnist']


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=4)
  parser.add_argument('--clients', type=int, default=10)
  parser.add_argument('--tasks', default='emnist,stackoverflow_word')
  args = bench_args.parse(parser, SMOKE)
  assert args.rounds >= 3
  worker, address = bench_common.start_worker()
  counter = ByteCounter()
  try:
    distributed.install_worker_context([address], interceptors=[counter])
    with tempfile.TemporaryDirectory() as tmp:
      for name in args.tasks.split(','):
        data_dir = os.path.join(tmp, name)
        os.makedirs(data_dir)
        task = _task(name, data_dir)
        results = {}
        for mode, on_workers in (('datasets', False), ('ids', True)):
          per_round = _measure(task, counter, os.path.join(tmp, 'runs'), f'{name}-{mode}',
                               args.rounds, args.clients, on_workers)
          sent = statistics.median(sum(s.values()) for s, _ in per_round)
          received = statistics.median(r for _, r in per_round)
          kinds = per_round[-1][0]
          results[mode] = sent
          print(f'{name:18s} {mode:8s} sent/round {_fmt(sent)}  received/round '
                f'{_fmt(received)}  ({args.clients} clients; last measured round by request: '
                + ', '.join(f'{k} {_fmt(v).strip()}' for k, v in sorted(kinds.items()) if v)
                + ')', flush=True)
        print(f'{name:18s} datasets/ids sent ratio {results["datasets"] / results["ids"]:.2f}; '
              f'saved {_fmt(results["datasets"] - results["ids"]).strip()} per round '
              f'({(results["datasets"] - results["ids"]) / args.clients / 1e3:.1f} kB per '
              'client)', flush=True)
  finally:
    worker.terminate()
    worker.wait(timeout=30)


if __name__ == '__main__':
  main()
