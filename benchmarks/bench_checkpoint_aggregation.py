"""Cost of checkpoint aggregates per round, and Algorithm 1 on a tiny DP regression task.

`ops`: seconds per update / value / get_state for a model of --params float32 parameters
(StackOverflow NWP is ~4M), i.e. the overhead the round loop pays per aggregate.
`algorithm1`: DP-FedAvg linear regression (noise-dominated), test loss of the last iterate and of
its EMA / past-k averages, training from the last iterate vs over the aggregate (tau=--tau).
Usage: python benchmarks/bench_checkpoint_aggregation.py [ops|algorithm1] [--params 4000000]
"""

import argparse
import math
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

import numpy as np  # noqa: E402

from tff_dp.execution import runtime as _runtime  # noqa: E402

_runtime.manage_workers()   # No TFF worker outlives the benchmark.
from tff_dp import checkpoint_aggregation as ca  # noqa: E402


def bench_ops(params: int, k: int, repeats: int) -> None:
  rng = np.random.default_rng(0)
  shapes = [(params // 2,), (params // 4, 2), (params - params // 2 - 2 * (params // 4),)]
  ckpts = [[rng.normal(size=s).astype(np.float32) for s in shapes] for _ in range(3)]
  for agg in (ca.EMAAggregate(0.999), ca.PastKAverage(k)):
    for i in range(k):
      agg.update(ckpts[i % 3])
    timings = {}
    for name, fn in (('update', lambda: agg.update(ckpts[0])), ('value', agg.value),
                     ('get_state', agg.get_state)):
      t0 = time.perf_counter()
      for _ in range(repeats):
        fn()
      timings[name] = (time.perf_counter() - t0) / repeats
    print(f'{type(agg).__name__:13s} params={params} '
          + '  '.join(f'{n} {s * 1e3:.1f} ms' for n, s in timings.items()))


def bench_algorithm1(rounds: int, tau: int, repeats: int) -> None:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  d, n_clients, n, m = 10, 20, 20, 5
  rng = np.random.default_rng(1)
  w_star = (rng.normal(size=d) / math.sqrt(d)).astype(np.float32)

  def sample(size):
    x = rng.normal(size=(size, d)).astype(np.float32)
    return x, (x @ w_star + 0.5 + 0.1 * rng.normal(size=size)).astype(np.float32)[:, None]

  datasets = [tf.data.Dataset.from_tensor_slices(sample(n)).batch(n) for _ in range(n_clients)]
  x_test, y_test = sample(4000)
  spec = datasets[0].element_spec

  def model_fn():
    model = tf.keras.Sequential([tf.keras.layers.Dense(
        1, kernel_initializer='zeros', input_shape=(d,))])
    return tff.learning.models.from_keras_model(
        model, loss=tf.keras.losses.MeanSquaredError(), input_spec=spec)

  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.25),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0),
      model_aggregator=tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
          noise_multiplier=1.0, clients_per_round=m, clip=1.0))

  def loss(flat):
    return float(np.mean((x_test @ flat[0] + flat[1] - y_test) ** 2))

  results = {}
  for kind in ('none', 'ema', 'past_k'):
    finals = []
    for _ in range(repeats):
      aggs = {'ema': ca.EMAAggregate(0.9), 'past_k': ca.PastKAverage(10)}
      policy = ca.TrainOnAggregate(kind, start_round=tau)
      state = process.initialize()
      tail = {'last': [], 'ema': [], 'past_k': []}
      for r in range(1, rounds + 1):
        ids = rng.choice(n_clients, m, replace=False)
        state = process.next(state, [datasets[i] for i in ids]).state
        mw = process.get_model_weights(state)
        weights = [np.asarray(w) for w in list(mw.trainable) + list(mw.non_trainable)]
        for agg in aggs.values():
          agg.update(weights)
        start = policy.select(r, weights, aggs)
        if start is not weights:
          state = policy.apply(process, state, start)
        if r > rounds // 2:
          tail['last'].append(loss(weights))
          tail['ema'].append(loss(aggs['ema'].value()))
          tail['past_k'].append(loss(aggs['past_k'].value()))
      finals.append({k: np.mean(v) for k, v in tail.items()})
    results[kind] = {k: float(np.mean([f[k] for f in finals])) for k in finals[0]}
    print(f'train_on_aggregate={kind:6s} mean test loss over last {rounds - rounds // 2} rounds '
          f'({repeats} runs): ' + '  '.join(f'{k} {v:.4f}' for k, v in results[kind].items()),
          flush=True)


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--params=10000', '--k=3', '--repeats=1']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('mode', nargs='?', default='ops', choices=('ops', 'algorithm1'))
  parser.add_argument('--params', type=int, default=4_000_000)
  parser.add_argument('--k', type=int, default=10)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--rounds', type=int, default=60)
  parser.add_argument('--tau', type=int, default=10)
  args = bench_args.parse(parser, SMOKE)
  if args.mode == 'ops':
    bench_ops(args.params, args.k, args.repeats)
  else:
    bench_algorithm1(args.rounds, args.tau, args.repeats)


if __name__ == '__main__':
  main()
