"""Reproduces a paper table: runs every arm of experiments/TABLE, then builds the table.

  python reproduce.py --table=andrew2021_emnist --scale=smoke      # minutes, embedded data
  python reproduce.py --table=all --scale=smoke                    # every table (what CI runs)
  python reproduce.py --table=andrew2021_emnist --scale=full --data_dir=~/.tff

Each arm is one flag file in experiments/TABLE/ holding the paper's settings (full scale) and
the paper's numbers (--paper_*). --scale=smoke layers experiments/TABLE/smoke.flags on top:
the embedded offline data, few rounds and clients (a pipeline check, not the paper's numbers).
--scale=full uses the real TFF datasets in --data_dir, downloaded beforehand with TFF's loaders
(e.g. tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=DATA_DIR)).

Each arm runs as its own `run_experiment.py` process (clean TF/TFF state, its own worker). An
arm whose run directory is complete is skipped, a partial one is resumed, so re-running the
command after an interruption continues where it stopped. Outputs:
  ROOT/TABLE-SCALE/runs/ARM/     the run directories
  ROOT/TABLE-SCALE/results.md    the table beside the paper's numbers, and the PNG plots
"""

import glob
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

_HERE = os.path.dirname(os.path.abspath(__file__))
_EXPERIMENTS_DIR = os.path.join(_HERE, 'experiments')
_SMOKE_FLAGS = 'smoke.flags'

_TABLE = flags.DEFINE_string(
    'table', None, 'Table to reproduce: a directory name under --experiments_dir, or "all".')
_SCALE = flags.DEFINE_enum(
    'scale', 'smoke', ['smoke', 'full'],
    'smoke: embedded offline data, few rounds/clients (minutes per table). full: the paper\'s '
    'settings on the real TFF datasets in --data_dir.')
_DATA_DIR = flags.DEFINE_string(
    'data_dir', os.path.join('~', '.tff'),
    '--scale=full: TFF dataset cache directory (TFF loaders\' default is ~/.tff).')
_ROOT_OUTPUT_DIR = flags.DEFINE_string(
    'root_output_dir', os.path.join('runs', 'tables'), 'Root of the outputs (see module doc).')
_EXPERIMENTS = flags.DEFINE_string(
    'experiments_dir', _EXPERIMENTS_DIR, 'Directory holding one sub-directory per table.')
_ARMS = flags.DEFINE_list('arms', None, 'Only these arms (flag-file names without .flags).')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the commands; run nothing.')
_EXTRA = flags.DEFINE_list(
    'extra_flags', [], 'Flags appended to every arm\'s command, e.g. '
    '--extra_flags=--total_rounds=50,--seed=1 (they override the flag files).')


def list_tables(experiments_dir: str) -> list[str]:
  return sorted(d for d in os.listdir(experiments_dir)
                if glob.glob(os.path.join(experiments_dir, d, '*.flags')))


def arm_name(arm_file: str) -> str:
  """experiments/TABLE/adaptive.flags -> 'adaptive' (also the run directory's name)."""
  return os.path.basename(arm_file)[:-len('.flags')]


def arm_files(table_dir: str) -> list[str]:
  return sorted(p for p in glob.glob(os.path.join(table_dir, '*.flags'))
                if os.path.basename(p) != _SMOKE_FLAGS)


def _run_state(run_dir: str) -> str:
  """'missing', 'partial' or 'complete' (the run wrote summary.json when it ended normally)."""
  if not os.path.isdir(run_dir) or not os.listdir(run_dir):
    return 'missing'
  return 'complete' if os.path.exists(os.path.join(run_dir, 'summary.json')) else 'partial'


def arm_command(arm_file: str, table_dir: str, runs_dir: str, scale: str, data_dir: str,
                extra: list[str]) -> list[str]:
  name = arm_name(arm_file)
  cmd = [sys.executable, os.path.join(_HERE, 'run_experiment.py'), f'--flagfile={arm_file}']
  if scale == 'smoke':
    cmd.append(f'--flagfile={os.path.join(table_dir, _SMOKE_FLAGS)}')
  else:
    cmd.append(f'--data_dir={data_dir}')
  cmd += [f'--root_output_dir={runs_dir}', f'--experiment_name={name}'] + list(extra)
  if _run_state(os.path.join(runs_dir, name)) == 'partial':
    cmd.append('--resume')
  return cmd


def _check_table(table: str, experiments_dir: str, scale: str) -> str:
  table_dir = os.path.join(experiments_dir, table)
  if not os.path.isdir(table_dir):
    raise ValueError(f'unknown --table {table!r}; available: '
                     f'{", ".join(list_tables(experiments_dir))}, all')
  if scale == 'smoke' and not os.path.isfile(os.path.join(table_dir, _SMOKE_FLAGS)):
    raise ValueError(f'{table_dir} has no {_SMOKE_FLAGS} for --scale=smoke')
  return table_dir


def reproduce_table(table: str, *, scale: str, data_dir: str, root_output_dir: str,
                    experiments_dir: str, arms=None, extra=(), dry_run=False) -> dict:
  """Runs (or resumes/skips) every arm of `table`, then writes the table; returns a summary."""
  from tff_dp import tables  # pylint: disable=g-import-not-at-top
  table_dir = _check_table(table, experiments_dir, scale)
  out_dir = os.path.join(root_output_dir, f'{table}-{scale}')
  runs_dir = os.path.join(out_dir, 'runs')
  files = arm_files(table_dir)
  if arms:
    unknown = set(arms) - {arm_name(f) for f in files}
    if unknown:
      raise ValueError(f'unknown --arms {sorted(unknown)} for table {table}')
    files = [f for f in files if arm_name(f) in arms]
  failed, run_dirs = [], []
  for arm_file in files:
    name = arm_name(arm_file)
    run_dir = os.path.join(runs_dir, name)
    if _run_state(run_dir) == 'complete':
      print(f'[{table}] {name}: complete, skipped', flush=True)
      run_dirs.append(run_dir)
      continue
    cmd = arm_command(arm_file, table_dir, runs_dir, scale, data_dir, list(extra))
    print(f'[{table}] {name}: {" ".join(cmd[1:])}', flush=True)
    if dry_run:
      continue
    t0 = time.monotonic()
    # TF's C++ start-up noise (cuDNN/cuFFT registration on a CPU machine) is level-2 logging.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get('TF_CPP_MIN_LOG_LEVEL', '3'))
    rc = subprocess.call(cmd, env=env)
    print(f'[{table}] {name}: exit {rc} after {time.monotonic() - t0:.0f}s', flush=True)
    if rc != 0:
      failed.append(name)
    if os.path.exists(os.path.join(run_dir, 'config.json')):
      run_dirs.append(run_dir)
  summary = {'table': table, 'failed': failed, 'run_dirs': run_dirs, 'output_dir': out_dir}
  if run_dirs and not dry_run:
    preamble = (f'Table `{table}`, scale `{scale}`'
                + (' (embedded synthetic data, few rounds: checks the pipeline; the numbers are '
                   'not comparable with the paper\'s).' if scale == 'smoke' else '.'))
    written = tables.build_tables(run_dirs, out_dir, preamble=preamble)
    summary.update(table_file=written['table'], plots=written['plots'])
    print(f'[{table}] table: {written["table"]}', flush=True)
  return summary


def main(argv) -> int:
  if len(argv) > 1:
    print(f'error: unexpected arguments {argv[1:]}', file=sys.stderr)
    return 2
  if not _TABLE.value:
    print('error: --table is required; available: '
          f'{", ".join(list_tables(_EXPERIMENTS.value))}, all', file=sys.stderr)
    return 2
  import tff_dp  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from tff_dp.errors import UserInputError  # pylint: disable=g-import-not-at-top
  data_dir = os.path.expanduser(_DATA_DIR.value)
  if _SCALE.value == 'full' and not os.path.isdir(data_dir):
    print(f'error: --data_dir {data_dir} does not exist; download the datasets first with '
          'TFF\'s loaders, e.g. tff.simulation.datasets.emnist.load_data(only_digits=False, '
          f'cache_dir="{data_dir}")', file=sys.stderr)
    return 2
  names = (list_tables(_EXPERIMENTS.value) if _TABLE.value == 'all' else [_TABLE.value])
  failed = []
  try:
    for table in names:
      summary = reproduce_table(
          table, scale=_SCALE.value, data_dir=data_dir, root_output_dir=_ROOT_OUTPUT_DIR.value,
          experiments_dir=_EXPERIMENTS.value, arms=_ARMS.value, extra=_EXTRA.value,
          dry_run=_DRY_RUN.value)
      failed += [f'{table}/{arm}' for arm in summary['failed']]
  except (ValueError, UserInputError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  if failed:
    print(f'error: arms failed: {", ".join(failed)} (rerun the same command to resume them)',
          file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  app.run(lambda argv: sys.exit(main(argv)))
