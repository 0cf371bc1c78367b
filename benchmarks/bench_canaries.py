"""Canaries (issue 16.3 and 16.5): estimated vs proven epsilon, utility, and bookkeeping cost.

For each task (EMNIST CNN, StackOverflow tag prediction) on a generated TFF-format cache of
`--population` real clients (the embedded data's generator), runs DP-FedAvg with flat adaptive
clipping, Poisson sampling of `--clients_per_round` expected clients, `--num_canaries` inserted
and as many unseen canaries, at each noise multiplier of `--noise`; and once more without
canaries at `--utility_noise`, to show what the canaries cost in accuracy (they take part of each
round's clients). Every run goes through `tff_dp.run(config)`, as a user's would.

Printed (markdown, for docs/PRIVACY.md):
* per run: proven epsilon (RDP, PLD; from the run's accountant at delta), the canary estimates
  (final model, all iterates) at the same delta, and the final eval accuracy;
* bookkeeping: the median over rounds of `canary_seconds` (coordinator: reading the model,
  one FFT cross-correlation, estimates on eval rounds) over `wall_seconds` (the whole round),
  and the median round wall time with and without canaries.

Usage: python benchmarks/bench_canaries.py [--tasks emnist,stackoverflow_tag] [--noise 0.5,1,2]
           [--population 2000] [--clients_per_round 100] [--num_canaries 1000]
           [--total_rounds 30] [--delta 1e-5] [--cache_root data_cache]
           [--out_dir /tmp/bench_canaries]
"""

import argparse
import json
import math
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench_args  # noqa: E402  (no TensorFlow)

# Per task: the generator family, settings that make the model learn in a few dozen rounds.
_TASKS = {
    'emnist': dict(family='emnist', settings=dict(clip=0.1, client_learning_rate=0.05)),
    'stackoverflow_tag': dict(family='stackoverflow',
                              settings=dict(clip=0.5, client_learning_rate=0.5)),
}


def _cache(cache_root: str, family: str, population: int) -> str:
  path = os.path.join(cache_root, f'bench-{family}-{population}')
  if not os.path.isdir(path) or not os.listdir(path):
    subprocess.run([sys.executable, '-m', 'tasks.synthetic_data', f'--family={family}',
                    f'--population={population}', f'--cache_dir={path}'], check=True, cwd=ROOT)
  return path


def _run(args, task: str, data_dir: str, noise: float, canaries: int) -> dict:
  import tasks   # pylint: disable=g-import-not-at-top,unused-import  (registers the tasks)
  import tff_dp   # pylint: disable=g-import-not-at-top
  from tff_dp.run_format import metrics_csv   # pylint: disable=g-import-not-at-top
  name = f'{task}-z{noise:g}-k{canaries}'
  cfg = tff_dp.ExperimentConfig.from_settings(
      dict(_TASKS[task]['settings']), task=task, data_dir=data_dir, dp='adaptive',
      noise_multiplier=noise, clients_per_round=args.clients_per_round,
      total_rounds=args.total_rounds, rounds_per_eval=10, num_canaries=canaries,
      delta=args.delta, root_output_dir=args.out_dir, experiment_name=name)
  summary = tff_dp.run(cfg, log=lambda line: None)
  rows = metrics_csv.read_numeric_rows(os.path.join(summary.run_dir, 'metrics.csv'))
  after_first = rows[1:] or rows
  estimates = (summary.privacy.get('empirical_estimate') or {}).get('estimates', {})
  return {
      'task': task, 'noise': noise, 'canaries': canaries, 'rounds': summary.rounds_completed,
      'population': json.load(open(os.path.join(summary.run_dir, 'config.json')))[
          'population_size'],
      'delta': summary.privacy['delta'], 'rdp': summary.privacy['epsilon'].get('rdp'),
      'pld': summary.privacy['epsilon'].get('pld'),
      'final_model': estimates.get('final_model', {}).get('epsilon'),
      'all_iterates': estimates.get('all_iterates', {}).get('epsilon'),
      'accuracy': [r['eval_accuracy'] for r in rows
                   if not math.isnan(r.get('eval_accuracy', math.nan))][-1],
      'wall': statistics.median(r['wall_seconds'] for r in after_first),
      'canary_share': (statistics.median(r['canary_seconds'] / r['wall_seconds']
                                         for r in after_first) if canaries else None),
  }


def _fmt(value, digits=3):
  return 'n/a' if value is None else f'{value:.{digits}g}'


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--tasks=emnist', '--noise=1', '--population=40', '--clients_per_round=5', '--num_canaries=4', '--total_rounds=2']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--tasks', default='emnist,stackoverflow_tag')
  parser.add_argument('--noise', default='0.5,1,2')
  parser.add_argument('--utility_noise', type=float, default=1.0)
  parser.add_argument('--population', type=int, default=2000)
  parser.add_argument('--clients_per_round', type=int, default=100)
  parser.add_argument('--num_canaries', type=int, default=1000)
  parser.add_argument('--total_rounds', type=int, default=30)
  parser.add_argument('--delta', type=float, default=1e-5,
                      help='one delta for every run (with and without canaries)')
  parser.add_argument('--cache_root', default=os.path.join(ROOT, 'data_cache'))
  parser.add_argument('--out_dir', default='/tmp/bench_canaries')
  args = bench_args.parse(parser, SMOKE)
  results = []
  for task in args.tasks.split(','):
    data_dir = _cache(args.cache_root, _TASKS[task]['family'], args.population)
    for noise in [float(z) for z in args.noise.split(',')]:
      results.append(_run(args, task, data_dir, noise, args.num_canaries))
      print(json.dumps(results[-1]), flush=True)
    results.append(_run(args, task, data_dir, args.utility_noise, 0))
    print(json.dumps(results[-1]), flush=True)
  print('\n| task | z | population (real + canaries) | rounds | proven eps RDP | proven eps PLD '
        '| estimate, final model | estimate, all iterates | eval accuracy |')
  print('|---|---|---|---|---|---|---|---|---|')
  for r in results:
    print(f'| {r["task"]} | {r["noise"]:g} | {r["population"]} ({r["canaries"]} canaries) '
          f'| {r["rounds"]} | {_fmt(r["rdp"])} | {_fmt(r["pld"])} | {_fmt(r["final_model"])} '
          f'| {_fmt(r["all_iterates"])} | {r["accuracy"]:.4f} |')
  print(f'\ndelta = {results[0]["delta"]:g} for every run (estimates and bounds at the same delta)')
  print('\n| task | z | median round wall s | canary bookkeeping / round |')
  print('|---|---|---|---|')
  for r in results:
    share = 'no canaries' if r['canary_share'] is None else f'{100 * r["canary_share"]:.2f}%'
    print(f'| {r["task"]} | {r["noise"]:g} ({r["canaries"]} canaries) | {r["wall"]:.2f} '
          f'| {share} |')


if __name__ == '__main__':
  main()
