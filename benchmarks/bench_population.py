"""Start-up, memory and round cost at 1,000 clients vs the full-size population (issue 13.6).

For each task and population this generates (once, cached) a synthetic TFF-format cache with
that many training clients (`tasks.synthetic_data.ensure_population_cache`: StackOverflow
'full' = 342,477 train / 38,758 heldout / 204,088 test clients, EMNIST 'full' = 3,400 writers),
then runs the real CLI (`run_experiment.py`, real TFF loaders) as its own process and measures:

  * first round: wall seconds from the process start to the console line of round 1 (imports,
    loading the client ids, building the TFF process, the eval set, and round 1 itself);
  * peak RSS of the coordinator (the Python process) and of its TFF worker_binary, polled from
    /proc every 0.1 s (total = the largest sum seen at one poll);
  * seconds per round: median of `round_seconds` (the `process.next` call) and of
    `wall_seconds` (the whole round: sampling, data, round, ledger, accounting, metrics) over
    rounds 2.. (round 1 includes one-off tracing).

and prints full/1000 ratios against the targets: first round within 60 s, memory and per-round
time within 10% of the 1,000-client population. The cache generation is not timed (it is
printed when it happens). A run whose process tree exceeds --max_rss_gb is stopped (and
reported), so the benchmark cannot exhaust a shared machine.

    python benchmarks/bench_population.py --tasks=stackoverflow_tag --clients_per_round=100
    python benchmarks/bench_population.py --tasks=emnist --clients_per_round=10 --repeats=3
"""

import argparse
import csv
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import bench_args  # noqa: E402  (no TensorFlow)

from tasks import synthetic_data  # noqa: E402  pylint: disable=wrong-import-position
from tff_dp.run_format import console  # noqa: E402  (imports no TensorFlow)

_FAMILY = {'emnist': 'emnist', 'stackoverflow_tag': 'stackoverflow',
           'stackoverflow_word': 'stackoverflow'}
_PAGE = os.sysconf('SC_PAGE_SIZE')


def _rss(pid: int) -> int:
  try:
    with open(f'/proc/{pid}/statm') as f:
      return int(f.read().split()[1]) * _PAGE
  except (OSError, IndexError, ValueError):
    return 0


def _children(pid: int) -> list[int]:
  out = []
  try:
    for tid in os.listdir(f'/proc/{pid}/task'):
      with open(f'/proc/{pid}/task/{tid}/children') as f:
        out.extend(int(c) for c in f.read().split())
  except OSError:
    pass
  return out


def _descendants(pid: int) -> list[int]:
  todo, seen = _children(pid), []
  while todo:
    c = todo.pop()
    seen.append(c)
    todo.extend(_children(c))
  return seen


class _Watcher(threading.Thread):
  """Polls the RSS of a process and its descendants; stops the tree above `limit` bytes."""

  def __init__(self, proc: subprocess.Popen, limit: int):
    super().__init__(daemon=True)
    self.proc, self.limit = proc, limit
    self.peak_coordinator = self.peak_worker = self.peak_total = 0
    self.exceeded = False
    self._done = threading.Event()

  def run(self):
    while not self._done.is_set() and self.proc.poll() is None:
      coordinator = _rss(self.proc.pid)
      worker = sum(_rss(c) for c in _descendants(self.proc.pid))
      self.peak_coordinator = max(self.peak_coordinator, coordinator)
      self.peak_worker = max(self.peak_worker, worker)
      self.peak_total = max(self.peak_total, coordinator + worker)
      if coordinator + worker > self.limit and not self.exceeded:
        self.exceeded = True
        os.killpg(self.proc.pid, signal.SIGKILL)   # Its own session: only this run's tree.
      self._done.wait(0.1)

  def stop(self):
    self._done.set()
    self.join()


def run_one(task: str, data_dir: str, args, out_root: str) -> dict:
  name = f'{task}-{os.path.basename(data_dir)}'
  cmd = [sys.executable, '-u', args.runner,
         f'--task={task}', f'--data_dir={data_dir}', f'--root_output_dir={out_root}',
         f'--experiment_name={name}', f'--clients_per_round={args.clients_per_round}',
         f'--total_rounds={args.rounds}', '--client_sampling=fixed_size', '--sampling_seed=0',
         '--dp=adaptive', '--clip=0.1', '--noise_multiplier=0.5',
         f'--rounds_per_eval={args.rounds}', f'--rounds_per_checkpoint={args.rounds}',
         ] + args.extra
  env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED='1')
  start = time.perf_counter()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, cwd=ROOT, start_new_session=True)
  watcher = _Watcher(proc, int(args.max_rss_gb * 2**30))
  watcher.start()
  first_round = None
  tail = []
  for line in proc.stdout:
    tail = (tail + [line.rstrip()])[-15:]
    if first_round is None and console.parse_round_line(line) is not None:
      first_round = time.perf_counter() - start
      print(f'  [{name}] first round after {first_round:.1f} s: {line.strip()}', flush=True)
  rc = proc.wait()
  total = time.perf_counter() - start
  watcher.stop()
  result = dict(task=task, data_dir=data_dir, first_round_s=first_round, total_s=total, rc=rc,
                peak_coordinator_mib=watcher.peak_coordinator / 2**20,
                peak_worker_mib=watcher.peak_worker / 2**20,
                peak_total_mib=watcher.peak_total / 2**20, exceeded=watcher.exceeded)
  if rc != 0:
    print(f'  [{name}] exit {rc}' + (' (stopped: over --max_rss_gb)' if watcher.exceeded
                                     else '') + '\n    ' + '\n    '.join(tail), flush=True)
  metrics = os.path.join(out_root, name, 'metrics.csv')
  if os.path.exists(metrics):
    with open(metrics) as f:
      rows = list(csv.DictReader(f))
    later = rows[1:] or rows
    if later:
      result['round_s'] = statistics.median(float(r['round_seconds']) for r in later)
      result['round_wall_s'] = statistics.median(float(r['wall_seconds']) for r in later)
      result['rounds'] = len(rows)
  return result


def _fmt(v, spec='.1f'):
  return '-' if v is None else format(v, spec)


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--tasks=emnist', '--populations=40,50', '--clients_per_round=5', '--rounds=2']


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--tasks', default='stackoverflow_tag,emnist')
  parser.add_argument('--populations', default='1000,full',
                      help='comma-separated; the first is the reference for the ratios')
  parser.add_argument('--clients_per_round', type=int, default=100)
  parser.add_argument('--rounds', type=int, default=4)
  parser.add_argument('--repeats', type=int, default=1,
                      help='runs per (task, population), interleaved; medians are reported '
                      '(the shared machine\'s load swings more than the population effect)')
  parser.add_argument('--cache_root', default=os.path.expanduser(
      os.path.join('~', '.cache', 'tff_dp', 'population')))
  parser.add_argument('--runner', default=os.path.join(ROOT, 'run_experiment.py'),
                      help='script taking run_experiment.py\'s flags (to measure a variant)')
  parser.add_argument('--max_rss_gb', type=float, default=6.0,
                      help='stop a run whose process tree exceeds this (shared machine)')
  parser.add_argument('extra', nargs='*', help='more run_experiment.py flags (after --)')
  args = bench_args.parse(parser, SMOKE)
  with open('/proc/loadavg') as f:
    print(f'load average at start: {" ".join(f.read().split()[:3])} '
          f'({os.cpu_count()} cores)', flush=True)
  runs = []
  with tempfile.TemporaryDirectory(prefix='bench_population_') as out_root:
    for task in args.tasks.split(','):
      family = _FAMILY[task]
      for population in args.populations.split(','):
        synthetic_data.ensure_population_cache(
            os.path.join(args.cache_root, f'{family}-{population}'), family, population,
            log=lambda m: print('  ' + m, flush=True))
      for repeat in range(args.repeats):
        for population in args.populations.split(','):
          data_dir = os.path.join(args.cache_root, f'{family}-{population}')
          print(f'running {task} on {data_dir} (repeat {repeat + 1}) ...', flush=True)
          r = run_one(task, data_dir, args, os.path.join(out_root, str(repeat)))
          r['population'] = population
          runs.append(r)
  results = []
  for task in args.tasks.split(','):
    for population in args.populations.split(','):
      mine = [r for r in runs if r['task'] == task and r['population'] == population]
      merged = dict(mine[0], exceeded=any(r['exceeded'] for r in mine))
      for key in ('first_round_s', 'round_s', 'round_wall_s', 'peak_coordinator_mib',
                  'peak_worker_mib', 'peak_total_mib'):
        values = [r[key] for r in mine if r.get(key) is not None]
        merged[key] = statistics.median(values) if values else None
      results.append(merged)
  with open('/proc/loadavg') as f:
    print(f'load average at end: {" ".join(f.read().split()[:3])}')
  print(f'\n{args.clients_per_round} clients per round (fixed size), {args.rounds} rounds, '
        f'median of {args.repeats} interleaved run(s); round s = median of process.next over '
        'rounds 2..; peaks over the whole run\n')
  print('| task | population | first round s | s/round (next) | s/round (whole) | '
        'peak coordinator MiB | peak worker MiB | peak total MiB |')
  print('| --- | --- | --- | --- | --- | --- | --- | --- |')
  for r in results:
    print(f"| {r['task']} | {r['population']} | {_fmt(r['first_round_s'])} | "
          f"{_fmt(r.get('round_s'), '.2f')} | {_fmt(r.get('round_wall_s'), '.2f')} | "
          f"{_fmt(r['peak_coordinator_mib'], '.0f')} | {_fmt(r['peak_worker_mib'], '.0f')} | "
          f"{_fmt(r['peak_total_mib'], '.0f')}{' (stopped)' if r['exceeded'] else ''} |")
  ref_pop = args.populations.split(',')[0]
  print('\nratios against the first population (targets: first round <= 60 s; others <= 1.10)')
  for task in args.tasks.split(','):
    ref = next(r for r in results if r['task'] == task and r['population'] == ref_pop)
    for r in results:
      if r['task'] != task or r is ref:
        continue
      parts = []
      for key in ('round_s', 'round_wall_s', 'peak_coordinator_mib', 'peak_worker_mib',
                  'peak_total_mib'):
        a, b = ref.get(key), r.get(key)
        if a and b:
          ratio = b / a
          parts.append(f'{key} {ratio:.2f}{"" if ratio <= 1.10 else " (MISSED)"}')
      first = r['first_round_s']
      parts.insert(0, f'first round {_fmt(first)} s'
                   + ('' if first is not None and first <= 60 else ' (MISSED)'))
      print(f"  {task} {r['population']}/{ref_pop}: " + ', '.join(parts))


if __name__ == '__main__':
  main()
