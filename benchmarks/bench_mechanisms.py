"""The noise in the final model of DP mechanisms at equal epsilon (issue 27.6a), measured from
runs whose clients send zero updates (so the model after n rounds is pure noise), beside theory.

Mechanisms, each calibrated to --epsilon at --delta over --rounds rounds of one client each
(the aggregate is a sum), on a --dim vector:
  gaussian  independent noise every round (DP-FedAvg without amplification); single
            participation: one Gaussian per client, final noise z clip sqrt(n)
  tree      TFF's tree aggregation (`dp=ftrl`), calibrated with --mechanism=tree (replace-special)
  bandmf    the banded square root (--bands, at most the min separation)
  blt       the optimized BLT
Participation: single (--setting=single: each client once, min separation n) or multi
(--setting=multi: each client every --cycle rounds, e.g. EMNIST's 3,400 clients at 100 per
round: every 34 rounds); gaussian and tree are then calibrated for that schedule too (Poisson
with q = 1 / cycle, and shuffled epochs of --cycle rounds).
Theory: gaussian z clip sqrt(n); blt / bandmf `accounting.correlated.noise_std_in_model`; the
tree's is measured only (TFF's efficient tree estimator has no closed form here).

Usage: python benchmarks/bench_mechanisms.py [--setting single|multi] [--rounds 1600]
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
import tensorflow_federated as tff  # noqa: E402

from tff_dp import mechanisms  # noqa: E402
from tff_dp.accounting import calibration  # noqa: E402
from tff_dp.accounting import correlated  # noqa: E402
from tff_dp.aggregators import noise_feed  # noqa: E402


def _final_noise(factory, dim: int, rounds: int) -> tuple[float, float]:
  """(std over coordinates of the sum of the n rounds' results, seconds per round)."""
  process = factory.create(tff.to_type([(np.float32, [dim])]))
  state, total = process.initialize(), np.zeros(dim)
  zero = [[np.zeros(dim, np.float32)]]
  # Correlated noise is fed from beside the process, as a run feeds it (aggregators.noise_feed).
  feed = noise_feed.for_factory(factory)
  t0 = time.perf_counter()
  for r in range(1, rounds + 1):
    out = process.next(feed.into(state, r) if feed else state, zero)
    if feed:
      feed.commit(r)
    state, total = out.state, total + np.asarray(out.result[0], np.float64)
  return float(np.std(total)), (time.perf_counter() - t0) / rounds


def arms(setting: str, rounds: int, cycle: int, epsilon: float, delta: float, clip: float,
         bands: int):
  """[(name, factory, theory or None, z)] at equal epsilon."""
  single = setting == 'single'
  separation = rounds if single else cycle
  participations = 1 if single else math.ceil(rounds / cycle)
  z_corr = correlated.calibrate(epsilon, delta)
  population = rounds if single else cycle   # One client per round.
  if single:
    z_gauss = z_corr   # Each client once: one Gaussian per client.
  else:
    z_gauss = calibration.calibrate_noise_multiplier(
        epsilon, delta, rounds, sampling_probability=1.0 / cycle).noise_multiplier
  z_tree = calibration.calibrate_noise_multiplier(
      epsilon, delta, rounds, population_size=population, clients_per_round=1,
      mechanism='tree').noise_multiplier
  out = [('gaussian', mechanisms.build_aggregator(
      'fixed', noise_multiplier=z_gauss, clients_per_round=1.0, clip=clip),
          z_gauss * clip * math.sqrt(rounds), z_gauss),
         ('tree', mechanisms.build_aggregator(
             'ftrl', noise_multiplier=z_tree, clients_per_round=1.0, clip=clip,
             rounds_per_epoch=population), None, z_tree)]
  for kind in ('bandmf', 'blt'):
    extra = {'bands': min(bands, separation)} if kind == 'bandmf' else {}
    factory = mechanisms.build_aggregator(
        kind, noise_multiplier=z_corr, clients_per_round=1.0, clip=clip, rounds=rounds,
        min_separation=separation, max_participations=participations, **extra)
    out.append((kind, factory,
                correlated.noise_std_in_model(factory.coefs, rounds, factory.stddev), z_corr))
  return out


SMOKE = ['--rounds=12', '--dim=200', '--cycle=4']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--setting', choices=('single', 'multi'), default='single')
  parser.add_argument('--rounds', type=int, default=1600)
  parser.add_argument('--cycle', type=int, default=34, help='multi: rounds between a '
                      "client's participations (population // clients per round)")
  parser.add_argument('--epsilon', type=float, default=8.0)
  parser.add_argument('--delta', type=float, default=1e-6)
  parser.add_argument('--clip', type=float, default=1.0)
  parser.add_argument('--dim', type=int, default=4000)
  parser.add_argument('--bands', type=int, default=64,
                      help='bandmf: bands (at most the min separation); each is a buffer')
  args = bench_args.parse(parser, SMOKE)
  print(f'# {args.setting} participation, {args.rounds} rounds, epsilon {args.epsilon} at '
        f'delta {args.delta}, clip {args.clip}, {args.dim} coordinates')
  print('| mechanism | z | final noise std | theory | measured / theory | x tree | s/round |')
  print('| --- | --- | --- | --- | --- | --- | --- |')
  results = []
  for name, factory, theory, z in arms(args.setting, args.rounds, args.cycle, args.epsilon,
                                      args.delta, args.clip, args.bands):
    std, seconds = _final_noise(factory, args.dim, args.rounds)
    results.append((name, z, std, theory, seconds))
  tree_std = next(std for name, _, std, _, _ in results if name == 'tree')
  for name, z, std, theory, seconds in results:
    versus = f'{theory:.4g} | {std / theory:.3f}' if theory else 'n/a | n/a'
    print(f'| {name} | {z:.4g} | {std:.4g} | {versus} | {std / tree_std:.3f} | {seconds:.4f} |')

if __name__ == '__main__':
  main()
