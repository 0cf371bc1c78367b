"""Command-line rounds with their checkpoints: correlated noise against `fixed` as users run it
(issue 53).

Each arm is one `run_experiment.py` process, exactly as a user starts it: the task (EMNIST's CNN
or StackOverflow's LSTM) on the embedded data, 10 clients per round, a checkpoint every round
(which BLT and BandMF require, and which `fixed` is given too, so the arms write alike),
evaluation off. The arms run one after another, `--repetitions` times in rotating order (this
machine's round time drifts by 15-30% between runs). For each run the script reads, at every
round's console line, the bytes the run's processes (the coordinator and its TFF worker) have
passed to `write` so far (`wchar` of /proc/PID/io: checkpoints, noise snapshots, ledger,
metrics), and afterwards `wall_seconds` of metrics.csv (the whole round, its checkpoint
included). It reports per arm, over the last `--steady` rounds before the stop: the mean seconds
a round and the bytes written a round (the default window of 128 rounds holds one of 64-band
BandMF's noise snapshots, which come every 126 rounds, so both are amortized over it), and their
ratios to `fixed`; and the bytes of checkpoints and snapshots on disk at the stop.

Resume: each run is planned for `--rounds` + 2 rounds and sent SIGTERM at round `--rounds`'s
line, as a user stops a run: it checkpoints the round under way (`--rounds` + 1) and exits, or
exits at once if the signal falls between two rounds. It is then resumed (`--resume`) for the
rounds left, and the script reports the seconds from the resumed process's start to its first
round's line: start-up, the checkpoint's load, BandMF's noise buffers rebuilt from their last
snapshot, and that round.

Targets (issue 53): BandMF with 64 bands at most 1.15x `fixed`'s round and 1.5x its bytes;
its resume at round 200 within 30 s of `fixed`'s.

Usage: python benchmarks/bench_cli_rounds.py [--task emnist] [--rounds 140] [--steady 128]
       [--repetitions 2] [--arms fixed,bandmf] [--bands 64]
"""

import argparse
import csv
import os
import signal
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench_args  # noqa: E402  (no TensorFlow)
import bench_common  # noqa: E402

from tff_dp import run_format  # noqa: E402  (file names; imports no TensorFlow)
from tff_dp.execution import runtime  # noqa: E402  (/proc helpers only; imports no TensorFlow)

# Each arm's mechanism flags; every arm samples exactly 10 clients a round.
ARMS = {
    'fixed': ['--dp=fixed', '--client_sampling=fixed_size'],
    'blt': ['--dp=blt', '--client_sampling=min_separation'],
    'bandmf': ['--dp=bandmf', '--client_sampling=min_separation'],
}
TASKS = ('emnist', 'stackoverflow_word')   # The embedded data holds both.
TARGET_TIME, TARGET_BYTES, TARGET_RESUME_EXTRA = 1.15, 1.5, 30.0


def bytes_written(pid: int) -> int:
  """Bytes process `pid` has passed to write() (`wchar`), 0 once it is gone."""
  try:
    with open(f'/proc/{pid}/io') as f:
      return next(int(line.split()[1]) for line in f if line.startswith('wchar:'))
  except (OSError, StopIteration):
    return 0


def _tree_bytes(pid: int, seen: dict) -> int:
  """Bytes written so far by `pid` and its workers (a worker's last reading is kept after it
  exits)."""
  for p in [pid, *runtime.worker_pids(pid)]:
    seen[p] = max(seen.get(p, 0), bytes_written(p))
  return sum(seen.values())


def run_arm(arm: str, args, out_dir: str, name: str) -> dict:
  """One run of `arm`, stopped after round `args.rounds` or the next and resumed: {'seconds':
  steady round seconds, 'bytes': steady bytes a round, 'checkpoint_bytes': checkpoints and
  snapshots on disk at the stop, 'resume_seconds': the resume's start to its round's line}."""
  cmd = [sys.executable, os.path.join(ROOT, 'run_experiment.py'), f'--task={args.task}',
         f'--embedded_data_dir={os.path.join(ROOT, "data_cache", "embedded")}',
         *ARMS[arm], '--clip=0.1', '--noise_multiplier=0.7', '--clients_per_round=10',
         f'--total_rounds={args.rounds + 2}', '--rounds_per_checkpoint=1',
         f'--rounds_per_eval={args.rounds + 3}', f'--root_output_dir={out_dir}',
         f'--experiment_name={name}'] + ([f'--bands={args.bands}'] if arm == 'bandmf' else [])
  written, seen = {}, {}
  _run(cmd, arm, stop_after=args.rounds,
       on_round=lambda pid, r: written.setdefault(r, _tree_bytes(pid, seen)))
  run_dir = os.path.join(out_dir, name)
  checkpoint_bytes = _checkpoint_bytes(run_dir)
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    seconds = {int(r['round']): float(r['wall_seconds']) for r in csv.DictReader(f)}
  resume = [*cmd[:2], '--resume', f'--root_output_dir={out_dir}', f'--experiment_name={name}']
  resumed = []
  resume_seconds = _run(resume, arm, stop_after=None, on_round=lambda pid, r: resumed.append(r))
  first = args.rounds - args.steady
  return {'seconds': statistics.mean(seconds[r] for r in range(first + 1, args.rounds + 1)),
          'bytes': (written[args.rounds] - written[first]) / args.steady,
          'checkpoint_bytes': checkpoint_bytes, 'resume_seconds': resume_seconds,
          'resumed_at': resumed[0]}


def _run(cmd: list, arm: str, stop_after, on_round=lambda pid, r: None) -> float:
  """Runs `cmd`, calling `on_round(pid, round)` at each round's line and sending SIGTERM at
  round `stop_after`'s (the run stops after the round under way, if any); returns the seconds
  from the start to its first round's line."""
  env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL='3')
  first_line = None
  start = time.monotonic()

  def at_round(pid, r):
    nonlocal first_line
    first_line = first_line or time.monotonic() - start
    on_round(pid, r)
    if r == stop_after:
      os.kill(pid, signal.SIGTERM)

  returncode, tail = bench_common.run_command_rounds(cmd, env, at_round)
  expected = 0 if stop_after is None else 128 + signal.SIGTERM
  if returncode != expected or first_line is None:
    sys.exit('\n'.join(tail) + f'\n{arm}: run_experiment.py exited with {returncode}, '
             f'not {expected}')
  return first_line


def _checkpoint_bytes(run_dir: str) -> int:
  """Bytes of the run's checkpoints and noise snapshots on disk (in the open or under
  secret/)."""
  total = 0
  for folder in run_format.CHECKPOINT_FOLDERS + (
      os.path.join(run_format.SECRET_FOLDER, run_format.NOISE_SNAPSHOTS_FOLDER),):
    for dirpath, _, names in os.walk(os.path.join(run_dir, folder)):
      total += sum(os.path.getsize(os.path.join(dirpath, n)) for n in names)
  return total


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=2', '--steady=1', '--repetitions=1', '--bands=2']


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--task', default='emnist', choices=TASKS)
  parser.add_argument('--rounds', type=int, default=140,
                      help='Rounds measured before the stop (then resumed for the rest).')
  parser.add_argument('--steady', type=int, default=128,
                      help='The last rounds of each run that are measured.')
  parser.add_argument('--repetitions', type=int, default=2)
  parser.add_argument('--arms', default='fixed,bandmf', help=f'From {",".join(ARMS)}.')
  parser.add_argument('--bands', type=int, default=64, help='BandMF\'s bands.')
  args = bench_args.parse(parser, SMOKE)
  arms = args.arms.split(',')
  if set(arms) - set(ARMS) or 'fixed' not in arms or not 1 <= args.steady < args.rounds:
    parser.error(f'--arms from {",".join(ARMS)}, fixed among them; 1 <= --steady < --rounds')
  print(f'{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; {args.task}, '
        f'10 clients, {args.rounds} rounds, a checkpoint every round; the last {args.steady} '
        f'rounds of each run measured', flush=True)
  results = {arm: [] for arm in arms}
  with tempfile.TemporaryDirectory(prefix='bench_cli_rounds-') as out_dir:
    for i, arm in enumerate(bench_common.rotating_order(arms, args.repetitions)):
      results[arm].append(run_arm(arm, args, out_dir, f'{arm}-{i}'))
      last = results[arm][-1]
      print(f'  {arm}: {last["seconds"]:.3f} s/round, {last["bytes"] / 2**20:.1f} MiB '
            f'written/round, resumed at round {last["resumed_at"]} in '
            f'{last["resume_seconds"]:.1f} s', flush=True)
  median = {arm: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            for arm, runs in results.items()}
  base = median['fixed']
  print(f'\n{"arm":<8} {"s/round":>8} {"x fixed":>8} {"MiB written/round":>18} {"x fixed":>8} '
        f'{"on disk MiB":>12} {"resume s":>9} {"- fixed":>8}')
  for arm, m in median.items():
    print(f'{arm:<8} {m["seconds"]:>8.3f} {m["seconds"] / base["seconds"]:>8.2f} '
          f'{m["bytes"] / 2**20:>18.1f} {m["bytes"] / max(base["bytes"], 1):>8.2f} '
          f'{m["checkpoint_bytes"] / 2**20:>12.1f} {m["resume_seconds"]:>9.1f} '
          f'{m["resume_seconds"] - base["resume_seconds"]:>+8.1f}')
  print(f'targets: at most {TARGET_TIME}x fixed per round, {TARGET_BYTES}x its bytes a round, '
        f'a resume at most {TARGET_RESUME_EXTRA:.0f} s longer than fixed\'s')


if __name__ == '__main__':
  main()
