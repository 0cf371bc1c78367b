"""Memory soak of the real CLI: coordinator and TFF worker RSS over a long run (issue 13).

Runs `run_experiment.py` as a subprocess, exactly as a user does: EMNIST on the embedded data,
10 clients per round (Poisson, the default), adaptive DP, EMA and past-k aggregates
(--ema_beta=0.9 --past_k=3), evaluation every round and a checkpoint every 10 rounds, with
z=0.7 (at a small z such as 0.3 epsilon passes 100 and the PLD accountant's composed loss
distribution, legitimately, gains ~0.2 MB per round: accounting state, not a leak). This
script reads the console line each round prints after its last output (metrics, TensorBoard,
checkpoint) and, at that moment, the VmRSS of the run_experiment.py process (the coordinator)
and of its `worker_binary` child from /proc. A single reading swings by tens of MB (malloc,
executor set-up), so each report is the median over the `--window` rounds ending at the
report round, and the slope is a least-squares fit over every round from the first report on.

--samples_csv is written as the run goes (one row per round), so an interrupted soak still
leaves its readings. Target (issue 40): growth from the first report to the last of at most 5%
for each process, from round 20 to round 200 (`--rounds 200 --report_at 20,110,200`).
With `--extra_flags=--worker_restart_rounds=N` the worker is replaced every N rounds; the
script then also prints the wall time of the rounds that ran first on a new worker against the
others (the price of a restart).
Usage: python benchmarks/bench_soak.py [--rounds 500] [--report_at 50,250,500] [--window 9]
       [--extra_flags='--worker_restart_rounds=100']
       (quick check: --rounds 100 --report_at 30,100)
"""

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench_args  # noqa: E402  (no TensorFlow)

from tff_dp.execution import runtime  # noqa: E402  (/proc helpers only; imports no TensorFlow)
from tff_dp.run_format import console  # noqa: E402  (imports no TensorFlow)

TARGET_GROWTH = 0.05


def slope(xs, ys) -> float:
  """Least-squares slope of ys over xs (nan with fewer than two distinct xs)."""
  return statistics.linear_regression(xs, ys).slope if len(set(xs)) > 1 else float('nan')


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=4', '--report_at=2,4', '--window=1']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--rounds', type=int, default=500)
  parser.add_argument('--report_at', default='50,250,500',
                      help='Rounds to report RSS at (comma-separated, each <= --rounds).')
  parser.add_argument('--window', type=int, default=9,
                      help='Each report is the median over this many rounds ending there.')
  parser.add_argument('--samples_csv', default=None,
                      help='Also write round,coordinator_mib,worker_mib of every round here.')
  parser.add_argument('--extra_flags', default='',
                      help='More run_experiment.py flags, e.g. "--dp=none".')
  args = bench_args.parse(parser, SMOKE)
  report_at = sorted(int(r) for r in args.report_at.split(','))
  if report_at[-1] > args.rounds or report_at[0] < 1:
    parser.error('--report_at rounds must lie in [1, --rounds]')

  out_dir = tempfile.mkdtemp(prefix='bench_soak-')
  cmd = [sys.executable, os.path.join(ROOT, 'run_experiment.py'), '--task=emnist',
         f'--embedded_data_dir={os.path.join(ROOT, "data_cache", "embedded")}',
         '--dp=adaptive', '--clip=0.1', '--noise_multiplier=0.7', '--clients_per_round=10',
         f'--total_rounds={args.rounds}', '--ema_beta=0.9', '--past_k=3',
         '--rounds_per_eval=1', '--rounds_per_checkpoint=10', f'--root_output_dir={out_dir}',
         '--experiment_name=soak'] + args.extra_flags.split()
  print('command:', ' '.join(cmd[1:]), flush=True)
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  start = time.monotonic()
  samples = {}   # round -> (coordinator MiB, worker MiB)
  worker_of_round = {}   # round -> pid of the worker seen after it
  csv_file = open(args.samples_csv, 'w') if args.samples_csv else None  # pylint: disable=consider-using-with
  if csv_file:   # Written as the run goes, so an interrupted soak still leaves its samples.
    csv_file.write('round,coordinator_mib,worker_mib\n')
  with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        env=env, cwd=ROOT) as proc:
    for line in proc.stdout:
      round_line = console.parse_round_line(line)
      if round_line is None:
        if 'error' in line.lower():
          print(line.rstrip(), flush=True)
        continue
      r = round_line.round_num
      workers = runtime.worker_pids(proc.pid)
      samples[r] = (runtime.rss_mib(proc.pid), runtime.rss_mib(workers[0]) if workers else float('nan'))
      worker_of_round[r] = workers[0] if workers else None
      if csv_file:
        csv_file.write(f'{r},{samples[r][0]:.1f},{samples[r][1]:.1f}\n')
        csv_file.flush()
      if r % 25 == 0 or r == 1:
        print(f'  round {r:4d}  coordinator {samples[r][0]:7.0f} MiB  worker '
              f'{samples[r][1]:7.0f} MiB  ({time.monotonic() - start:.0f} s)', flush=True)
  if proc.returncode != 0 or max(samples, default=0) < args.rounds:
    sys.exit(f'run_experiment.py exited with {proc.returncode} after round '
             f'{max(samples, default=0)}')

  if csv_file:
    csv_file.close()
  print(f'\n{args.rounds} rounds in {time.monotonic() - start:.0f} s; median RSS over the '
        f'{args.window} rounds ending at each report round (MiB):')
  print(f'{"round":>7} {"coordinator":>12} {"worker":>10}')
  reports = {}
  for r in report_at:
    window = [samples[i] for i in range(max(1, r - args.window + 1), r + 1) if i in samples]
    reports[r] = tuple(statistics.median(s[k] for s in window) for k in (0, 1))
    print(f'{r:>7} {reports[r][0]:>12.0f} {reports[r][1]:>10.0f}')
  first, last = report_at[0], report_at[-1]
  rounds = [r for r in sorted(samples) if r >= first]
  ok = True
  for k, name in ((0, 'coordinator'), (1, 'worker')):
    growth = reports[last][k] / reports[first][k] - 1
    fit = slope(rounds, [samples[r][k] for r in rounds])
    ok &= growth <= TARGET_GROWTH
    print(f'{name}: {growth:+.1%} from round {first} to {last} (target <= '
          f'{TARGET_GROWTH:.0%}); least-squares slope {fit:+.2f} MiB/round over rounds '
          f'{first}..{last}')
  print('target met' if ok else 'TARGET MISSED')
  _report_worker_restarts(worker_of_round, os.path.join(out_dir, 'soak', 'metrics.csv'))


def _report_worker_restarts(worker_of_round, metrics_csv):
  """Wall seconds of the rounds that ran on a freshly started worker against the others."""
  fresh = {r for r in worker_of_round if r > 1 and worker_of_round[r] is not None
           and worker_of_round.get(r - 1) not in (None, worker_of_round[r])}
  if not fresh:
    print('the worker was never restarted')
    return
  with open(metrics_csv, newline='') as f:
    wall = {int(row['round']): float(row['wall_seconds']) for row in csv.DictReader(f)}
  others = [wall[r] for r in wall if r > 1 and r not in fresh]
  print(f'worker restarts: {len(fresh)} (first rounds on a new worker: '
        f'{", ".join(map(str, sorted(fresh)))}); median wall s/round {statistics.median(wall[r] for r in fresh):.2f} '
        f'on a new worker vs {statistics.median(others):.2f} otherwise')


if __name__ == '__main__':
  main()
