"""AdaDPS benchmark: DP-FedAvg with and without side-information preconditioning.

Runs the seeded synthetic sparse linear task (AdaDPS toy example) and the (synthetic-cache)
StackOverflow tag-prediction task, at the same clip, noise, clients per round and rounds, and
prints a small table. The baseline gets a small client learning-rate grid, so the comparison
is not won by tuning AdaDPS alone.

  .venv/bin/python benchmarks/bench_adadps.py [--rounds 30] [--skip_stackoverflow]
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

from tff_dp.execution import runtime as _runtime  # noqa: E402

_runtime.manage_workers()   # No TFF worker outlives the benchmark.
import numpy as np  # noqa: E402
import tensorflow_federated as tff  # noqa: E402

from tff_dp import adadps  # noqa: E402
from tff_dp.adadps import synthetic  # noqa: E402
from tff_dp.aggregators.fixed import FixedClipGaussianFactory  # noqa: E402
from tff_dp.aggregators.preconditioned import PreconditionedFactory  # noqa: E402
from tff_dp.training.builders import adadps_setup  # noqa: E402
import tasks  # noqa: E402
from tasks import synthetic_data  # noqa: E402


def _train(model_fn, client_datasets_fn, num_clients, client_opt, aggregator, rounds,
           clients_per_round, seed):
  """Runs DP-FedAvg; returns the final global ModelWeights."""
  process = tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn, client_optimizer_fn=client_opt,
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0), model_aggregator=aggregator)
  state = process.initialize()
  rng = np.random.default_rng(seed)
  for _ in range(rounds):
    ids = rng.choice(num_clients, clients_per_round, replace=False)
    state = process.next(state, [client_datasets_fn(i) for i in ids]).state
  return process.get_model_weights(state)


def bench_sparse(args, rows):
  task = synthetic.make_sparse_linear_task(seed=args.seed)
  shapes = adadps.weight_shapes_of(task.keras_model_fn())
  freq_scales = adadps.build_scales(
      adadps.token_frequency_side_info(task.feature_counts, shapes), cap=args.cap,
      division=args.division)
  keras_model = task.keras_model_fn()
  public = [task.client_dataset(i) for i in range(args.num_public_clients)]
  sm_scales = adadps.build_scales(
      adadps.public_second_moment_side_info(keras_model, task.loss_fn(), public),
      eps=args.eps)
  # Second-moment scales are ~1/|g|: normalise so the smallest (most active coordinate) is 1, as
  # for the frequency scales, so one learning rate fits both.
  sm_scales = [s / sm_scales[0].min() for s in sm_scales]
  sgd = tff.learning.optimizers.build_sgdm
  dp = lambda: FixedClipGaussianFactory(args.clip, args.noise, args.clients_per_round)
  configs = [(f'DP-FedAvg lr={lr}', lambda lr=lr: (sgd(lr), dp())) for lr in (0.01, 0.03, 0.1)]
  configs += [
      ('AdaDPS client, feature freq lr=0.03',
       lambda: (adadps.build_preconditioned_sgd(0.03, freq_scales), dp())),
      ('AdaDPS client, public E[g^2] lr=0.03',
       lambda: (adadps.build_preconditioned_sgd(0.03, sm_scales), dp())),
      ('AdaDPS server, feature freq lr=0.03',
       lambda: (sgd(0.03), PreconditionedFactory(freq_scales, dp()))),
      ('AdaDPS server+unscale, feature freq lr=0.1',
       lambda: (sgd(0.1), PreconditionedFactory(freq_scales, dp(), unscale=True))),
  ]
  init = task.loss(np.zeros((task.num_features, 1)))
  for name, make in configs:
    t = time.time()
    opt, agg = make()
    weights = _train(task.model_fn, task.client_dataset, task.num_clients, opt, agg,
                     args.rounds, args.clients_per_round, args.seed)
    rows.append(('sparse_linear', name, f'mse {task.loss(weights.trainable[0]):.3f} '
                 f'(init {init:.2f})', time.time() - t))


def bench_stackoverflow(args, rows):
  data_dir = args.data_dir or tempfile.mkdtemp(prefix='bench_adadps_')
  synthetic_data.ensure_default_cache(data_dir, 'stackoverflow_tag')
  task = tasks.build_task('stackoverflow_tag', data_dir)
  train_ids = list(task.train_data.client_ids)
  clients_per_round = min(args.clients_per_round, len(train_ids))
  client_ds = lambda i: task.preprocess_train(
      task.train_data.create_tf_dataset_for_client(train_ids[i]))
  scales = adadps_setup.scales_for_task(task, 'word_freq', cap=args.cap, division=args.division)
  eval_ds = task.preprocess_eval(
      task.test_data.create_tf_dataset_from_all_clients().take(2000))
  sgd = tff.learning.optimizers.build_sgdm
  dp = lambda: FixedClipGaussianFactory(args.clip, args.noise, clients_per_round)
  for name, opt in [(f'DP-FedAvg lr={args.so_lr}', sgd(args.so_lr)),
                    (f'AdaDPS client, word freq lr={args.so_lr}',
                     adadps.build_preconditioned_sgd(args.so_lr, scales))]:
    t = time.time()
    weights = _train(task.model_fn, client_ds, len(train_ids), opt, dp(), args.rounds,
                     clients_per_round, args.seed)
    model = task.keras_model_fn()
    model.compile(loss=task.loss_fn(), metrics=task.metrics_fn())
    weights.assign_weights_to(model)
    res = model.evaluate(eval_ds, verbose=0, return_dict=True)
    rows.append(('stackoverflow_tag', name,
                 f'acc {res.get("accuracy", float("nan")):.4f} loss {res["loss"]:.3f}',
                 time.time() - t))


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=2', '--clients_per_round=5']


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--rounds', type=int, default=30)
  p.add_argument('--clients_per_round', type=int, default=20)
  p.add_argument('--clip', type=float, default=1.0)
  p.add_argument('--noise', type=float, default=1.0)
  p.add_argument('--cap', type=float, default=1000.0)
  p.add_argument('--division', type=float, default=1.0)
  p.add_argument('--eps', type=float, default=1e-8)
  p.add_argument('--num_public_clients', type=int, default=10)
  p.add_argument('--so_lr', type=float, default=0.1)
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--data_dir', default=None)
  p.add_argument('--skip_stackoverflow', action='store_true')
  args = bench_args.parse(p, SMOKE)
  rows = []
  bench_sparse(args, rows)
  if not args.skip_stackoverflow:
    bench_stackoverflow(args, rows)
  print(f'\nDP-FedAvg, clip {args.clip}, noise multiplier {args.noise}, '
        f'{args.clients_per_round} clients/round, {args.rounds} rounds')
  print(f'{"task":<18} {"method":<42} {"result":<26} {"secs":>6}')
  for task, name, result, secs in rows:
    print(f'{task:<18} {name:<42} {result:<26} {secs:6.1f}')


if __name__ == '__main__':
  main()
