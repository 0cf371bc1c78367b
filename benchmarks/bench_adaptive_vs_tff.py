"""Round time: our flat adaptive factory vs TFF's `gaussian_adaptive`, in build_unweighted_fed_avg.

EMNIST CNN (built inline), 10 clients x 100 random examples per round; rounds of the two arms
are interleaved so machine noise hits both alike. Prints per-arm median seconds and the ratio
(target <= 1.1x). Usage: python benchmarks/bench_adaptive_vs_tff.py [--rounds 5]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

from tff_dp.execution import runtime as _runtime  # noqa: E402

_runtime.manage_workers()   # No TFF worker outlives the benchmark.
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from tff_dp import aggregators  # noqa: E402

_CLIENTS, _EXAMPLES, _BATCH = 10, 100, 20
_NOISE = 0.5  # TFF's default sigma_b = m/20 = 0.5 needs z < 1.


def _keras_cnn():
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(input_shape=(28, 28, 1)),
      tf.keras.layers.Conv2D(32, 3, activation='relu'),
      tf.keras.layers.Conv2D(64, 3, activation='relu'),
      tf.keras.layers.MaxPool2D(),
      tf.keras.layers.Dropout(0.25),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(128, activation='relu'),
      tf.keras.layers.Dropout(0.5),
      tf.keras.layers.Dense(10)])


def _model_fn():
  return tff.learning.models.from_keras_model(
      _keras_cnn(), loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      input_spec=(tf.TensorSpec([None, 28, 28, 1], tf.float32),
                  tf.TensorSpec([None], tf.int32)))


def _client_data(seed):
  rng = np.random.default_rng(seed)
  return [tf.data.Dataset.from_tensor_slices(
      (rng.random((_EXAMPLES, 28, 28, 1), np.float32),
       rng.integers(0, 10, _EXAMPLES).astype(np.int32))).batch(_BATCH)
          for _ in range(_CLIENTS)]


def _process(aggregator):
  return tff.learning.algorithms.build_unweighted_fed_avg(
      _model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.02),
      model_aggregator=aggregator)


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=1']


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--rounds', type=int, default=5)
  args = bench_args.parse(parser, SMOKE)
  m = float(_CLIENTS)
  arms = {
      'tff_gaussian_adaptive': _process(
          tff.aggregators.DifferentiallyPrivateFactory.gaussian_adaptive(
              noise_multiplier=_NOISE, clients_per_round=m, initial_l2_norm_clip=0.1)),
      'tff_dp_adaptive': _process(aggregators.AdaptiveClipGaussianFactory(
          noise_multiplier=_NOISE, clients_per_round=m, initial_clip=0.1)),
  }
  data = _client_data(0)
  states = {name: p.initialize() for name, p in arms.items()}
  for name, p in arms.items():  # Warm-up round (tracing, executor start).
    states[name] = p.next(states[name], data).state
  times = {name: [] for name in arms}
  for r in range(args.rounds):
    order = list(arms) if r % 2 == 0 else list(reversed(arms))
    for name in order:
      start = time.perf_counter()
      states[name] = arms[name].next(states[name], data).state
      times[name].append(time.perf_counter() - start)
  for name, ts in times.items():
    print(f'{name}: median {statistics.median(ts):.3f}s/round over {len(ts)} rounds '
          f'({", ".join(f"{t:.2f}" for t in ts)})')
  ratio = statistics.median(times['tff_dp_adaptive']) / statistics.median(
      times['tff_gaussian_adaptive'])
  # Per-round paired ratios are robust to load drifting over the run (shared machine).
  paired = statistics.median(a / b for a, b in zip(times['tff_dp_adaptive'],
                                                    times['tff_gaussian_adaptive']))
  print(f'ratio tff_dp_adaptive / tff_gaussian_adaptive = {ratio:.3f}x (medians), '
        f'{paired:.3f}x (median of paired rounds); target <= 1.1x')


if __name__ == '__main__':
  main()
