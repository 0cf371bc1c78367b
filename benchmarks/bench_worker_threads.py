"""The TFF worker's inter-op threads: command-line rounds with TensorFlow's default pool against
the package's (issue 53, "both cores used").

TensorFlow sizes a process's inter-op pool (the threads that run graph nodes) to its cores;
the worker trains every client of a round as a session of its own, all sharing that pool, and
the package starts it with twice as many (`runtime.DEFAULT_WORKER_ENV`). Each arm is one
`run_experiment.py` process as a user starts it (the task on the embedded data, `--clients`
clients a round by fixed-size sampling, adaptive DP, evaluation and checkpoints off), with
TF_NUM_INTEROP_THREADS exported for it (a value the user exports wins over the package's, and
the coordinator's own pool was measured to make no difference): `default` exports nothing (the
package's setting), a number exports that count. The arms run `--repetitions` times in rotating
order (this machine's round time drifts by 15-30% between runs). Per run the script takes the
median `round_seconds` of metrics.csv after `--warmup` rounds, and the CPU seconds of the
coordinator and its worker per round over the same rounds (read from /proc at the rounds'
console lines); it reports each arm's median over the repetitions, its ratio to TensorFlow's
own pool size (the cores), and the cores kept busy (CPU seconds per second of round).

Usage: python benchmarks/bench_worker_threads.py [--task stackoverflow_word] [--clients 10]
       [--rounds 14] [--warmup 3] [--repetitions 3] [--arms 2,default,8]
"""

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench_args  # noqa: E402  (no TensorFlow)
import bench_common  # noqa: E402

from tff_dp.execution import runtime  # noqa: E402  (/proc helpers only; imports no TensorFlow)

TASKS = ('emnist', 'stackoverflow_word')   # The embedded data holds both.

# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--task=emnist', '--clients=2', '--rounds=2', '--warmup=1', '--repetitions=1',
         '--arms=default']


def run_arm(arm: str, args, out_dir: str) -> tuple[float, float, float]:
  """One run of `arm`, after the warm-up: (median seconds a round, CPU seconds a round, cores
  kept busy: CPU seconds per second between the round lines)."""
  cmd = [sys.executable, os.path.join(ROOT, 'run_experiment.py'), f'--task={args.task}',
         f'--embedded_data_dir={os.path.join(ROOT, "data_cache", "embedded")}',
         '--dp=adaptive', '--clip=0.5', '--noise_multiplier=0.5',
         f'--clients_per_round={args.clients}', '--client_sampling=fixed_size',
         f'--total_rounds={args.rounds}', f'--rounds_per_eval={args.rounds + 1}',
         f'--rounds_per_checkpoint={args.rounds + 1}', f'--root_output_dir={out_dir}',
         '--experiment_name=run']
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  env.pop('TF_NUM_INTEROP_THREADS', None)
  if arm != 'default':
    env['TF_NUM_INTEROP_THREADS'] = arm
  cpu, wall = {}, {}

  def at_round(pid, r):
    cpu[r] = sum(runtime.cpu_seconds(p) for p in [pid, *runtime.worker_pids(pid)])
    wall[r] = time.monotonic()

  returncode, tail = bench_common.run_command_rounds(cmd, env, at_round)
  if returncode != 0:
    sys.exit('\n'.join(tail) + f'\narm {arm}: run_experiment.py exited with {returncode}')
  with open(os.path.join(out_dir, 'run', 'metrics.csv'), newline='') as f:
    seconds = [float(r['round_seconds']) for r in csv.DictReader(f)
               if int(r['round']) > args.warmup]
  used = cpu[args.rounds] - cpu[args.warmup]
  return (statistics.median(seconds), used / (args.rounds - args.warmup),
          used / (wall[args.rounds] - wall[args.warmup]))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--task', default='stackoverflow_word', choices=TASKS)
  parser.add_argument('--clients', type=int, default=10)
  parser.add_argument('--rounds', type=int, default=14)
  parser.add_argument('--warmup', type=int, default=3, help='Rounds not measured, first.')
  parser.add_argument('--repetitions', type=int, default=3)
  parser.add_argument('--arms', default=None,
                      help='Inter-op thread counts, or `default` for the package\'s '
                           '(default: the cores, `default`, 4x the cores).')
  args = bench_args.parse(parser, SMOKE)
  cores = runtime.schedulable_cores()
  arms = (args.arms or f'{cores},default,{4 * cores}').split(',')
  if any(a != 'default' and not (a.isdigit() and int(a) > 0) for a in arms):
    parser.error('--arms: positive thread counts or `default`')
  if not 1 <= args.warmup < args.rounds:
    parser.error('--warmup must be >= 1 and < --rounds')
  print(f'{cores} cores, load average {os.getloadavg()[0]:.1f} at start; {args.task}, '
        f'{args.clients} clients a round, rounds {args.warmup + 1}-{args.rounds} measured, '
        f'{args.repetitions} repetitions; package default: '
        f'{runtime.DEFAULT_WORKER_ENV["TF_NUM_INTEROP_THREADS"]} threads', flush=True)
  runs = {a: [] for a in arms}
  for arm in bench_common.rotating_order(arms, args.repetitions):
    with tempfile.TemporaryDirectory(prefix='bench_worker_threads-') as out_dir:
      runs[arm].append(run_arm(arm, args, out_dir))
    seconds, cpu, busy = runs[arm][-1]
    print(f'  {arm:>8}: round {seconds:.3f} s, {cpu:.2f} CPU-s, {busy:.2f} cores', flush=True)
  base = statistics.median(r[0] for r in runs[str(cores)]) if str(cores) in runs else None
  print(f'\nmedians over the repetitions\n{"threads":>8} {"round s":>8} {"CPU-s":>7} '
        f'{"cores":>6} {"/TF default":>11}')
  for arm in arms:
    seconds, cpu, busy = (statistics.median(r[i] for r in runs[arm]) for i in range(3))
    ratio = f'{seconds / base:.2f}' if base else '-'
    print(f'{arm:>8} {seconds:>8.3f} {cpu:>7.2f} {busy:>6.2f} {ratio:>11}')


if __name__ == '__main__':
  main()
