"""Noise cohort, the evidence (issue 28.4): does a run of m clients per round with the noise of
a cohort of M (`noise_cohort_size=M`) reach the accuracy of a real M-client round?

Arms, on a generated EMNIST cache in TFF's format, DP-FedAvg (fixed clip, Poisson sampling), the
same noise multiplier, rounds and seeds (model init and sampling seed), evaluated on held-out
writers (covered):
  real      M clients per round (the production round the simulation stands for);
  cohort    m clients per round, noise of M (noise_cohort_size=M);
  small     m clients per round with its own noise (what a simulation without a cohort shows).
The claim holds when the cohort arm's mean final accuracy lies within the real arm's run-to-run
spread (mean +- 2 sd over the seeds). Arms alternate seed by seed, so load drifts hit all.

  .venv/bin/python benchmarks/bench_noise_cohort.py [--rounds 30] [--seeds 3]
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

import tff_dp  # noqa: E402
from tasks import synthetic_data  # noqa: E402
from tff_dp.run_format import metrics_csv  # noqa: E402
from tff_dp.training import config as config_lib  # noqa: E402

ARMS = ('real', 'cohort', 'small')


def _settings(args, arm: str, seed: int, data_dir: str, out_dir: str) -> dict:
  settings = dict(
      task='emnist', data_dir=data_dir, dp='fixed', clip=args.clip,
      noise_multiplier=args.noise_multiplier, client_learning_rate=args.client_learning_rate,
      total_rounds=args.rounds, rounds_per_eval=args.rounds, eval_data='holdout',
      seed=seed, sampling_seed=seed, root_output_dir=out_dir,
      experiment_name=f'{arm}-seed{seed}', clients_per_round=(
          args.cohort if arm == 'real' else args.simulated))
  if arm == 'cohort':
    settings.update(noise_cohort_size=args.cohort, noise_population=args.population)
  return settings


def _final_accuracy(run_dir: str) -> float:
  rows = metrics_csv.MetricsCsv(os.path.join(run_dir, 'metrics.csv')).read_rows()
  return float([r['eval_accuracy'] for r in rows if r.get('eval_accuracy')][-1])


def _summary(values) -> str:
  sd = statistics.stdev(values) if len(values) > 1 else 0.0
  return f'{statistics.mean(values):.4f} +- {sd:.4f}'


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=2', '--seeds=1', '--population=120', '--cohort=10', '--simulated=5']


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=30)
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--population', type=int, default=2000,
                      help='writers generated (a tenth held out for evaluation)')
  parser.add_argument('--cohort', type=int, default=100, help='M: the real round\'s clients')
  parser.add_argument('--simulated', type=int, default=20, help='m: the simulated round\'s')
  parser.add_argument('--noise_multiplier', type=float, default=1.0)
  parser.add_argument('--clip', type=float, default=0.1)
  parser.add_argument('--client_learning_rate', type=float, default=0.05)
  parser.add_argument('--cache_dir', default=os.path.join(tempfile.gettempdir(),
                                                          'tff_dp_bench_noise_cohort'))
  args = bench_args.parse(parser, SMOKE)
  data_dir = synthetic_data.ensure_population_cache(
      os.path.join(args.cache_dir, f'emnist-{args.population}'), 'emnist', args.population)
  out_dir = tempfile.mkdtemp(prefix='bench_noise_cohort_')
  print(f'{time.strftime("%Y-%m-%d")}, {os.cpu_count()} cores; EMNIST generated, '
        f'{args.population} writers; DP-FedAvg fixed clip {args.clip}, z = '
        f'{args.noise_multiplier}, {args.rounds} rounds, M = {args.cohort}, m = '
        f'{args.simulated}; seeds 0..{args.seeds - 1}')
  accuracy = {arm: [] for arm in ARMS}
  for seed in range(args.seeds):
    for arm in ARMS:
      cfg = config_lib.ExperimentConfig.from_settings(
          _settings(args, arm, seed, data_dir, out_dir))
      start = time.perf_counter()
      summary = tff_dp.run(cfg, log=lambda line: None)
      accuracy[arm].append(_final_accuracy(summary.run_dir))
      print(f'  {arm:<7} seed {seed}: final eval accuracy {accuracy[arm][-1]:.4f} '
            f'({time.perf_counter() - start:.0f} s)', flush=True)
  print(f'\n{"arm":<8} {"clients/round":>13} {"noise of":>9} {"final accuracy":>18}')
  for arm in ARMS:
    clients = args.cohort if arm == 'real' else args.simulated
    noise_of = args.simulated if arm == 'small' else args.cohort
    print(f'{arm:<8} {clients:>13} {noise_of:>9} {_summary(accuracy[arm]):>18}')
  real = accuracy['real']
  sd = statistics.stdev(real) if len(real) > 1 else 0.0
  low, high = statistics.mean(real) - 2 * sd, statistics.mean(real) + 2 * sd
  inside = low <= statistics.mean(accuracy['cohort']) <= high
  print(f'\ncohort mean within the real arm\'s mean +- 2 sd [{low:.4f}, {high:.4f}]: '
        f'{"yes" if inside else "no"}')


if __name__ == '__main__':
  main()
