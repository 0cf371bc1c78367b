"""What BandMF's noise state costs where it rides, against where it could be held (issue 40.1).

Today the b - 1 model-sized buffers of the streaming banded inverse are part of the learning
process's state, which TFF moves between the coordinator and its worker every round. This
measures, interleaved in one process on TFF's local C++ worker:
  * a round of a minimal TFF process whose server state is k model-sized float32 tensors
    (k = 1: one noise input per round; k = bands - 1: the buffers riding the round trip), with
    10 clients of one scalar each, so that the round is the state's round trip;
  * one step of the same streaming banded inverse in numpy, with the buffers held once by the
    coordinator (fresh draws z_t, w_t = (z_t - sum_j c_j w_{t-j}) / c_0).
It prints each arm's median seconds and the ratios: how much of a BandMF round the state's
round trip is, and what holding it beside the process would cost instead.

Usage: python benchmarks/bench_noise_state.py [--model_size 4050000] [--bands 64]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

SMOKE = ['--model_size=1000', '--bands=3', '--repetitions=1']


def _process_with_state(copies: int, size: int):
  """A TFF process whose server state is `copies` tensors of `size` float32, passed through."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  import tensorflow_federated as tff
  state_type = tff.types.StructWithPythonType(
      [tff.TensorType(np.float32, [size])] * copies, tuple)

  @tff.tensorflow.computation
  def initial():
    return tuple(tf.zeros([size]) for _ in range(copies))

  @tff.tensorflow.computation(state_type, np.float32)
  def server_update(state, total):
    return tuple(s + 0.0 * total for s in state)

  @tff.tensorflow.computation(np.float32)
  def client(x):
    return x + 1.0

  @tff.federated_computation
  def initialize():
    return tff.federated_eval(initial, tff.SERVER)

  @tff.federated_computation(tff.FederatedType(state_type, tff.SERVER),
                             tff.FederatedType(np.float32, tff.CLIENTS))
  def next_fn(state, values):
    total = tff.federated_sum(tff.federated_map(client, values))
    return tff.federated_map(server_update, (state, total))

  return tff.templates.IterativeProcess(initialize, next_fn)


class _NumpyBandedStream:
  """The streaming banded inverse with its buffers held in this process (numpy)."""

  def __init__(self, size: int, bands: int, seed: int = 0):
    import numpy as np  # pylint: disable=g-import-not-at-top
    self._np = np
    self._rng = np.random.Generator(np.random.Philox(key=seed))
    self._coefs = np.linspace(1.0, 0.1, bands, dtype=np.float32)
    self._outputs = [np.zeros(size, np.float32) for _ in range(bands - 1)]

  def step(self):
    w = self._rng.standard_normal(self._outputs[0].shape[0], dtype=self._np.float32)
    for c, previous in zip(self._coefs[1:], self._outputs):
      w -= c * previous
    w /= self._coefs[0]
    self._outputs = [w] + self._outputs[:-1]
    return w


def _median(values):
  ordered = sorted(values)
  return ordered[len(ordered) // 2]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model_size', type=int, default=4_050_000,
                      help='floats per model copy (default: the StackOverflow LSTM\'s)')
  parser.add_argument('--bands', type=int, default=64)
  parser.add_argument('--clients', type=int, default=10)
  parser.add_argument('--repetitions', type=int, default=3)
  args = bench_args.parse(parser, SMOKE)
  from tff_dp import runtime  # pylint: disable=g-import-not-at-top
  runtime.manage_workers()
  copies = sorted({1, args.bands - 1})
  processes = {k: _process_with_state(k, args.model_size) for k in copies}
  states = {k: p.initialize() for k, p in processes.items()}
  stream = _NumpyBandedStream(args.model_size, args.bands)
  values = [1.0] * args.clients
  for k, process in processes.items():   # Warm-up: tracing, the worker's executors.
    states[k] = process.next(states[k], values)
  stream.step()
  seconds = {k: [] for k in copies}
  seconds['numpy'] = []
  for _ in range(args.repetitions):   # Interleaved: the machine's drift hits every arm.
    for k, process in processes.items():
      start = time.perf_counter()
      states[k] = process.next(states[k], values)
      seconds[k].append(time.perf_counter() - start)
    start = time.perf_counter()
    stream.step()
    seconds['numpy'].append(time.perf_counter() - start)
  mib = args.model_size * 4 / 2**20
  print(f'model {args.model_size:,} floats ({mib:.1f} MiB), {args.bands} bands, '
        f'{args.clients} clients, median of {args.repetitions} interleaved rounds')
  for k in copies:
    print(f'  state of {k:3d} model copies ({k * mib:7.1f} MiB) rides the round trip: '
          f'{_median(seconds[k]):7.3f} s per round')
  numpy_s = _median(seconds['numpy'])
  print(f'  numpy streaming step, {args.bands - 1} buffers held once: {numpy_s:7.3f} s')
  riding, one = _median(seconds[copies[-1]]), _median(seconds[copies[0]])
  print(f'buffers riding / one noise input + numpy step: {riding / (one + numpy_s):.1f}x '
        f'({riding:.2f} s vs {one + numpy_s:.2f} s per round)')


if __name__ == '__main__':
  main()
