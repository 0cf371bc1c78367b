# Longer than 350 lines: a program (flag files, arms run as processes, skip / resume, the
# table), whose functions each do one step; the library parts live in tff_dp.tables.
"""Reproduces a paper table: runs every arm of experiments/TABLE, then builds the table.

  python reproduce.py --table=andrew2021_emnist --scale=smoke      # minutes, embedded data
  python reproduce.py --table=all --scale=smoke                    # every arm of every table
  python reproduce.py --table=andrew2021_emnist --scale=full --data_dir=~/.tff

Each arm is one flag file in experiments/TABLE/ holding the paper's settings (full scale) and
the paper's numbers (--paper_*). --scale=smoke layers experiments/TABLE/smoke.flags on top:
the embedded offline data, few rounds and clients (a pipeline check, not the paper's numbers).
--scale=full uses the real TFF datasets in --data_dir, downloaded beforehand with TFF's loaders
(e.g. tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=DATA_DIR)).

Each arm runs as its own `run_experiment.py` process (clean TF/TFF state, its own worker). An
arm whose run directory is complete is skipped, a partial one is resumed, so re-running the
command after an interruption continues where it stopped. Before anything runs, every run
directory about to be skipped or resumed is checked against the config its flags give now:
if its config.json records another value for any setting (a flag file was edited since, or a
flag removed so that a default applies), the command stops with an `error:` line instead of
passing the old run off as the current arm.

--extra_flags make a different run: it goes to its own directory ARM+SLUG+HASH (SLUG the flags
made filesystem-safe, HASH of the exact flag list), e.g. --extra_flags=--seed=1 runs
`adaptive+seed=1+<hash>` beside the seed-0 `adaptive`. The table covers the arms run plus every
finished run of them that differs only in the seed, one row per seed and a mean ± sd row.

Outputs:
  ROOT/TABLE-SCALE/runs/ARM/     the run directories (ARM+SLUG+HASH/ with --extra_flags)
  ROOT/TABLE-SCALE/results.md    the table beside the paper's numbers, and the PNG plots
"""

import dataclasses
import glob
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

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
    '--extra_flags=--total_rounds=50,--seed=1 (they override the flag files). The runs go to '
    'their own directories ARM+SLUG+HASH, so they never reuse the runs made without them.')

# Set by reproduce.py for each arm: not allowed in --extra_flags, not compared with config.json.
_PER_ARM_FLAGS = ('root_output_dir', 'experiment_name', 'resume')


def list_tables(experiments_dir: str) -> list[str]:
  return sorted(d for d in os.listdir(experiments_dir)
                if glob.glob(os.path.join(experiments_dir, d, '*.flags')))


def arm_name(arm_file: str) -> str:
  """experiments/TABLE/adaptive.flags -> 'adaptive' (its run directory without --extra_flags)."""
  return os.path.basename(arm_file)[:-len('.flags')]


def run_dir_name(arm: str, extra: Sequence[str]) -> str:
  """The run directory of `arm` run with `extra` flags.

  No extra flags: the arm's name, as always (existing runs stay valid). Otherwise
  ARM+SLUG+HASH: SLUG the flags without dashes, filesystem-safe and cut to 48 characters, for
  people; HASH the first 8 hex digits of SHA-256 over the exact flag list, so two different
  lists never share a directory even when their slugs collide or are cut.
  """
  if not extra:
    return arm
  slug = '+'.join(re.sub(r'[^A-Za-z0-9._=-]+', '_', f.lstrip('-')) for f in extra)
  digest = hashlib.sha256(json.dumps(list(extra)).encode()).hexdigest()[:8]
  return f'{arm}+{slug[:48].rstrip("+")}+{digest}'


def _split_flag(flag: str) -> tuple[str, Optional[str]]:
  """'--name=value' -> ('name', 'value'); '--name' -> ('name', None)."""
  name, sep, value = flag.lstrip('-').partition('=')
  return name, (value if sep else None)


def check_extra_flags(extra: Sequence[str]) -> None:
  """Raises ValueError unless every item is a flag reproduce.py leaves to the user."""
  for flag in extra:
    name, _ = _split_flag(flag)
    if not flag.startswith('-') or not name:
      raise ValueError(f'--extra_flags: {flag!r} is not a flag (--name=value); a value with a '
                       'comma cannot go through --extra_flags, put it in a flag file instead')
    if name in _PER_ARM_FLAGS or (name.startswith('no') and name[2:] in _PER_ARM_FLAGS):
      raise ValueError(f'--extra_flags: {flag} is set by reproduce.py for each arm (the run '
                       'directory is ROOT/TABLE-SCALE/runs/...; use --root_output_dir)')


def _as_flag(name: str, value) -> str:
  """A setting as the flag that gives it (`--name=value`, `--noname`, `--name` unset)."""
  if isinstance(value, bool):
    return f'--{"" if value else "no"}{name}'
  if value is None:
    return f'--{name} unset'
  if isinstance(value, (list, tuple)):
    value = ','.join(str(v) for v in value)
  elif isinstance(value, dict):
    value = ','.join(f'{k}={v}' for k, v in value.items())
  return f'--{name}={value}'


def arm_config(arm_flags: Sequence[str]):
  """The config `run_experiment.py` runs for these flags (flag files expanded as absl does);
  raises ValueError naming a bad flag or setting. Imports no TensorFlow."""
  # pylint: disable=g-import-not-at-top
  import tasks  # pylint: disable=unused-import  (registers the tasks run_experiment.py runs)
  from tff_dp import cli_flags
  from tff_dp.errors import UserInputError
  from tff_dp.training import config_flags
  try:
    return config_flags.parse(arm_flags)
  except UserInputError as e:
    raise ValueError(cli_flags.as_flags(str(e), config_flags.new_flag_values())) from None


def config_differences(recorded: dict, arm_flags: Sequence[str]) -> list[str]:
  """The settings of the arm's command that differ from what the run's config.json records,
  as the flags that give them now: every setting config.json records is compared (those a run
  directory written by an older version did not record are not), except the run's name, place
  and `resume`, which reproduce.py sets for each arm."""
  now = json.loads(json.dumps(arm_config(arm_flags).settings()))   # JSON types, as recorded.
  return [f'{_as_flag(name, value)} (the run has {recorded[name]!r})'
          for name, value in now.items()
          if name in recorded and name not in _PER_ARM_FLAGS and recorded[name] != value]


def arm_files(table_dir: str) -> list[str]:
  return sorted(p for p in glob.glob(os.path.join(table_dir, '*.flags'))
                if os.path.basename(p) != _SMOKE_FLAGS)


def _run_state(run_dir: str) -> str:
  """'missing', 'partial' or 'complete' (the run wrote summary.json when it ended normally)."""
  if not os.path.isdir(run_dir) or not os.listdir(run_dir):
    return 'missing'
  return 'complete' if os.path.exists(os.path.join(run_dir, 'summary.json')) else 'partial'


def _arm_flags(arm_file: str, table_dir: str, scale: str, data_dir: str,
               extra: Sequence[str]) -> list[str]:
  """The arm's settings on the command line: flag files, data, --extra_flags (last wins)."""
  cmd = [f'--flagfile={arm_file}']
  if scale == 'smoke':
    cmd.append(f'--flagfile={os.path.join(table_dir, _SMOKE_FLAGS)}')
  else:
    cmd.append(f'--data_dir={data_dir}')
  return cmd + list(extra)


def arm_command(arm_file: str, table_dir: str, runs_dir: str, scale: str, data_dir: str,
                extra: Sequence[str]) -> list[str]:
  name = run_dir_name(arm_name(arm_file), extra)
  cmd = [sys.executable, os.path.join(_HERE, 'run_experiment.py')]
  cmd += _arm_flags(arm_file, table_dir, scale, data_dir, ())
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


@dataclasses.dataclass
class ArmPlan:
  arm: str        # the flag file's name
  run_dir: str
  state: str      # missing | partial | complete (see _run_state)
  cmd: list


@dataclasses.dataclass
class TablePlan:
  table: str
  scale: str
  out_dir: str
  runs_dir: str
  arms: list      # [ArmPlan]


def _read_config(run_dir: str) -> Optional[dict]:
  """RUN_DIR/config.json, None if the run never wrote it; ValueError if unreadable."""
  path = os.path.join(run_dir, 'config.json')
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f'{path} is unreadable: {e}') from None


def _check_reusable(table: str, arm: str, run_dir: str, state: str,
                    arm_flags: Sequence[str]) -> None:
  """Refuses a run directory to be skipped or resumed that was made with other settings."""
  config = _read_config(run_dir)
  diffs = [] if config is None else config_differences(config, arm_flags)
  if diffs:
    more = f' and {len(diffs) - 3} more' if len(diffs) > 3 else ''
    raise ValueError(
        f'[{table}] {arm}: the {"finished" if state == "complete" else "interrupted"} run in '
        f'{run_dir} was made with other settings than the arm has now: {"; ".join(diffs[:3])}'
        f'{more}. Move or delete that directory to run the arm as it is now, or restore its '
        'flag file (nothing was run)')


def plan_table(table: str, *, scale: str, data_dir: str, root_output_dir: str,
               experiments_dir: str, arms=None, extra=()) -> TablePlan:
  """What `reproduce_table` will do for each arm; raises ValueError on bad input or on a run
  directory it would reuse that does not match the arm's flags. Writes nothing."""
  check_extra_flags(extra)
  table_dir = _check_table(table, experiments_dir, scale)
  out_dir = os.path.join(root_output_dir, f'{table}-{scale}')
  runs_dir = os.path.join(out_dir, 'runs')
  files = arm_files(table_dir)
  if arms:
    unknown = set(arms) - {arm_name(f) for f in files}
    if unknown:
      raise ValueError(f'unknown --arms {sorted(unknown)} for table {table}')
    files = [f for f in files if arm_name(f) in arms]
  plan = TablePlan(table, scale, out_dir, runs_dir, [])
  for arm_file in files:
    name = arm_name(arm_file)
    run_dir = os.path.join(runs_dir, run_dir_name(name, extra))
    state = _run_state(run_dir)
    arm_flags = _arm_flags(arm_file, table_dir, scale, data_dir, extra)
    try:
      arm_config(arm_flags)   # Every arm's flags are checked before the first arm runs.
    except ValueError as e:
      raise ValueError(f'[{table}] {name}: {e}') from None
    if state != 'missing':
      _check_reusable(table, name, run_dir, state, arm_flags)
    plan.arms.append(ArmPlan(name, run_dir, state,
                             arm_command(arm_file, table_dir, runs_dir, scale, data_dir, extra)))
  return plan


def _seed_siblings(runs_dir: str, run_dirs: Sequence[str]) -> list[str]:
  """Finished runs in `runs_dir`, other than `run_dirs`, that repeat one of them with another
  seed (config.json equal but for the seed): the table shows them together."""
  from tff_dp import tables  # pylint: disable=g-import-not-at-top
  keys = set()
  for d in run_dirs:
    config = _read_config(d)
    if config is not None:
      keys.add(tables.seed_group_key(config))
  siblings = []
  for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
    path = os.path.join(runs_dir, name)
    if path in run_dirs or _run_state(path) != 'complete':
      continue
    config = _read_config(path)
    if config is not None and tables.seed_group_key(config) in keys:
      siblings.append(path)
  return siblings


def run_table(plan: TablePlan, *, dry_run: bool = False) -> dict:
  """Runs (or resumes/skips) the planned arms, then writes the table; returns a summary."""
  from tff_dp import tables  # pylint: disable=g-import-not-at-top
  table = plan.table
  failed, run_dirs = [], []
  for arm in plan.arms:
    label = os.path.basename(arm.run_dir)
    if arm.state == 'complete':
      print(f'[{table}] {label}: complete, skipped', flush=True)
      run_dirs.append(arm.run_dir)
      continue
    print(f'[{table}] {label}: {" ".join(arm.cmd[1:])}', flush=True)
    if dry_run:
      continue
    t0 = time.monotonic()
    # TF's C++ start-up noise (cuDNN/cuFFT registration on a CPU machine) is level-2 logging.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get('TF_CPP_MIN_LOG_LEVEL', '3'))
    rc = _run_arm(arm.cmd, env)
    print(f'[{table}] {label}: exit {rc} after {time.monotonic() - t0:.0f}s', flush=True)
    if rc != 0:
      failed.append(arm.arm)
    if os.path.exists(os.path.join(arm.run_dir, 'config.json')):
      run_dirs.append(arm.run_dir)
  summary = {'table': table, 'failed': failed, 'run_dirs': run_dirs, 'output_dir': plan.out_dir}
  if run_dirs and not dry_run:
    siblings = _seed_siblings(plan.runs_dir, run_dirs)
    if siblings:
      print(f'[{table}] also tabulated, the same arms with other seeds: '
            f'{", ".join(os.path.basename(d) for d in siblings)}', flush=True)
    preamble = (f'Table `{table}`, scale `{plan.scale}`'
                + (' (embedded synthetic data, few rounds: checks the pipeline; the numbers are '
                   'not comparable with the paper\'s).' if plan.scale == 'smoke' else '.'))
    written = tables.build_tables(run_dirs + siblings, plan.out_dir, preamble=preamble)
    summary.update(table_runs=run_dirs + siblings, table_file=written['table'],
                   plots=written['plots'])
    print(f'[{table}] table: {written["table"]}', flush=True)
  return summary


def _run_arm(cmd, env) -> int:
  """Runs one arm's run_experiment.py to its end. The arm has its own process group, so a
  terminal's Ctrl-C reaches this process alone, which passes each one on: the first stops the
  arm as it stops a run (its rounds kept), a second aborts its round; then KeyboardInterrupt
  ends the table, so the next arm never starts."""
  proc = subprocess.Popen(cmd, env=env, process_group=0)
  interrupted = False
  while True:
    try:
      rc = proc.wait()
      break
    except KeyboardInterrupt:
      interrupted = True
      if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
  if interrupted:
    raise KeyboardInterrupt
  return rc


def reproduce_table(table: str, *, scale: str, data_dir: str, root_output_dir: str,
                    experiments_dir: str, arms=None, extra=(), dry_run=False) -> dict:
  """Plans then runs one table (see `plan_table` and `run_table`)."""
  return run_table(plan_table(table, scale=scale, data_dir=data_dir,
                              root_output_dir=root_output_dir, experiments_dir=experiments_dir,
                              arms=arms, extra=extra), dry_run=dry_run)


def main(argv) -> int:
  """argv (program name first) -> exit code: 0 done, 2 bad input (unknown flags included),
  1 an arm failed."""
  # No `runtime.manage_workers()` here: this process starts no TFF worker (each arm is a
  # run_experiment.py process that manages its own), so it never imports TensorFlow and a plan
  # or an error comes in about a second.
  from tff_dp import cli_flags  # pylint: disable=g-import-not-at-top
  from tff_dp.errors import UserInputError  # pylint: disable=g-import-not-at-top
  from tff_dp.training import preflight  # pylint: disable=g-import-not-at-top
  try:
    if cli_flags.parse(flags.FLAGS, argv, __doc__) == 0:   # Printed the help.
      return 0
  except UserInputError as e:
    return cli_flags.report(e, flags.FLAGS)
  # `~` expanded in every path flag (shells leave `--flag=~/x` alone).
  experiments_dir = os.path.expanduser(_EXPERIMENTS.value)
  root_output_dir = os.path.expanduser(_ROOT_OUTPUT_DIR.value)
  if not os.path.isdir(experiments_dir):
    print(f'error: --experiments_dir {experiments_dir} is not a directory (it holds one '
          'sub-directory of .flags files per table)', file=sys.stderr)
    return 2
  try:   # Where the runs go: checked before any arm (or its data) is made.
    preflight.check_writable(root_output_dir)
  except UserInputError as e:
    return cli_flags.report(e, flags.FLAGS)
  if not list_tables(experiments_dir):
    print(f'error: --experiments_dir {experiments_dir} holds no table (a table is a '
          'sub-directory of .flags files, as in experiments/)', file=sys.stderr)
    return 2
  if not _TABLE.value:
    print('error: --table is required; available: '
          f'{", ".join(list_tables(experiments_dir))}, all', file=sys.stderr)
    return 2
  data_dir = os.path.expanduser(_DATA_DIR.value)
  if _SCALE.value != 'full' and flags.FLAGS['data_dir'].present:
    print(f'error: --data_dir is where --scale=full reads the real datasets; --scale='
          f'{_SCALE.value} runs on the embedded data and would ignore it: drop it or give '
          '--scale=full', file=sys.stderr)
    return 2
  if _SCALE.value == 'full' and not os.path.isdir(data_dir):
    print(f'error: --data_dir {data_dir} does not exist; download the datasets first with '
          'TFF\'s loaders, e.g. tff.simulation.datasets.emnist.load_data(only_digits=False, '
          f'cache_dir="{data_dir}")', file=sys.stderr)
    return 2
  names = (list_tables(experiments_dir) if _TABLE.value == 'all' else [_TABLE.value])
  failed = []
  try:
    # Every table is planned (and its reused runs checked) before the first arm runs.
    plans = [plan_table(table, scale=_SCALE.value, data_dir=data_dir,
                        root_output_dir=root_output_dir,
                        experiments_dir=experiments_dir, arms=_ARMS.value, extra=_EXTRA.value)
             for table in names]
    for plan in plans:
      summary = run_table(plan, dry_run=_DRY_RUN.value)
      failed += [f'{plan.table}/{arm}' for arm in summary['failed']]
  except (ValueError, UserInputError) as e:
    return cli_flags.report(e, flags.FLAGS)
  except KeyboardInterrupt:
    print('stopped by SIGINT (Ctrl-C): the arm under way kept its completed rounds and no '
          'later arm started; rerun the same command to resume', file=sys.stderr)
    return 130
  if failed:
    print(f'error: arms failed: {", ".join(failed)} (rerun the same command to resume them)',
          file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  from tff_dp import cli_flags  # pylint: disable=g-import-not-at-top
  cli_flags.interruptible()   # Started as a background job too, Ctrl-C stops it.
  sys.exit(main(sys.argv))
