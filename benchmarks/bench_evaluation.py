"""Central evaluation: seconds per evaluation of the demo's model (EMNIST CNN, `--max_eval_examples`
test examples of held-out clients), eager against compiled (the evaluator's `tf.function`
step), the two arms interleaved in one process; the compiled arm's first call (its trace) is
reported apart. Last, the floor: the forward pass's multiply-adds over this machine's float32
matmul rate, which no evaluator of this model and data can go under here.

Usage: python benchmarks/bench_evaluation.py [--examples 2000] [--repetitions 10]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

from tff_dp.execution import runtime as _runtime  # noqa: E402

_runtime.manage_workers()   # No TFF worker outlives the benchmark.


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--examples', type=int, default=2000,
                      help='test examples per evaluation (the demo\'s --max_eval_examples)')
  parser.add_argument('--repetitions', type=int, default=10)
  parser.add_argument('--cache_dir', default=None,
                      help='where the EMNIST cache is generated (default: a temporary one)')
  args = bench_args.parse(parser, ['--examples=200', '--repetitions=2'])
  # pylint: disable=g-import-not-at-top  (TensorFlow after the flags)
  import numpy as np
  import tasks
  from tasks import synthetic_data
  from tff_dp.training.builders import build_evaluation
  from tff_dp.training.builders import evaluation
  cache = args.cache_dir or tempfile.mkdtemp(prefix='bench_evaluation_')
  synthetic_data.ensure_default_cache(cache, 'emnist')   # The demo's embedded data.
  task = tasks.load('emnist', cache, client_batch_size=20)
  data = build_evaluation.dataset(task, args.examples, seed=0)
  arms = {name: evaluation.CentralizedEvaluator(task.keras_model_fn, task.loss_fn,
                                                task.metrics_fn, data, compiled=compiled)
          for name, compiled in (('eager', False), ('compiled', True))}
  model = task.keras_model_fn()   # Weights in the evaluator's flat order.
  weights = [np.asarray(v) for v in model.trainable_weights + model.non_trainable_weights]
  first = {}
  for name, arm in arms.items():   # Each arm's first call (its trace and the data's cache).
    start = time.perf_counter()
    results = arm.evaluate(weights)
    first[name] = time.perf_counter() - start
    print(f'{name:9s} first call {first[name]:.2f} s  accuracy {results["accuracy"]:.4f}  '
          f'loss {results["loss"]:.4f}')
  seconds = {name: [] for name in arms}
  for _ in range(args.repetitions):   # Interleaved: the machine's drift hits both arms.
    for name, arm in arms.items():
      start = time.perf_counter()
      arm.evaluate(weights)
      seconds[name].append(time.perf_counter() - start)
  median = {name: statistics.median(s) for name, s in seconds.items()}
  print(f'examples {args.examples}, repetitions {args.repetitions}, median seconds per evaluation')
  for name in arms:
    print(f'{name:9s} {median[name]:.3f} s  (min {min(seconds[name]):.3f}, '
          f'max {max(seconds[name]):.3f})')
  print(f'compiled / eager: {median["compiled"] / median["eager"]:.2f}')
  # The floor no evaluator can go under on this machine: the forward pass's arithmetic at the
  # float32 rate TensorFlow reaches here on a large matmul.
  gflop = 2 * forward_macs(model) * args.examples / 1e9
  rate = matmul_gflops()
  print(f'forward pass {gflop:.1f} GFLOP; float32 matmul {rate:.0f} GFLOP/s on this machine: '
        f'at least {gflop / rate:.3f} s per evaluation (compiled at {gflop / median["compiled"]:.0f} '
        f'GFLOP/s)')


def forward_macs(model) -> int:
  """Multiply-adds of one example's forward pass through the model's Conv2D and Dense layers
  (the rest, pooling and activations, is a few percent of a CNN's)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  macs = 0
  for layer in model.layers:
    if isinstance(layer, (tf.keras.layers.Conv2D, tf.keras.layers.Dense)):
      per_output = int(np.prod(layer.kernel.shape[:-1]))
      macs += per_output * int(np.prod(layer.output_shape[1:]))
  return macs


def matmul_gflops(n: int = 2048, repetitions: int = 7) -> float:
  """The best float32 rate of an n x n matmul (a traced step, best of `repetitions`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  a, b = tf.random.normal([n, n]), tf.random.normal([n, n])
  step = tf.function(lambda: tf.reduce_sum(tf.matmul(a, b)))
  step()
  seconds = []
  for _ in range(repetitions):
    start = time.perf_counter()
    step()
    seconds.append(time.perf_counter() - start)
  return 2 * n**3 / min(seconds) / 1e9


if __name__ == '__main__':
  main()
