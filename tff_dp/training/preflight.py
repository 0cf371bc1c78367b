"""Every refusal a run can make without TensorFlow, made before it is imported: the data
files, what the population's size decides (when the task lists its clients without
TensorFlow), the run directory (its name, whether it exists, whether it can be created, its lock),
what a resume may change and whether it has rounds left, and the ledger a resume continues.

The command line calls `check` right after parsing its flags, so each of these refusals comes
in about a second, with nothing written; `tff_dp.run` calls it too, and the run directory
(`run_dir.RunDirectory`) makes the same checks with the same functions.
"""

import fcntl
import json
import os
import tempfile
from typing import Any, Optional

from tff_dp import choices
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp import run_format
from tff_dp import sampling
from tff_dp.run_format import metrics_csv
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib
from tff_dp.training import population
from tff_dp.training import task_registry
from tff_dp.training.config import ExperimentConfig

LOCK_FILE = '.lock'


def check(cfg: ExperimentConfig) -> None:
  """Raises UserInputError for the first refusal `cfg` meets (module docstring), for a run that
  builds the registered task `cfg.task` names."""
  cfg.validate()
  side_info = cfg.adadps.side_info
  if (cfg.adadps.precondition != 'none' and side_info.startswith('file:')
      and not os.path.isfile(os.path.expanduser(side_info[len('file:'):]))):
    raise UserInputError(f'`side_info={side_info}`: no such file (a .npy or .npz of the side '
                         'information)')
  task = task_registry.get(cfg.task.name)
  if (cfg.adadps.precondition != 'none' and task.token_side_info is not None
      and side_info in choices.TOKEN_SIDE_INFO and side_info not in task.token_side_info):
    offered = (f'it offers {choices.one_of(sorted(task.token_side_info))}'
               if task.token_side_info else 'it has no public token counts')
    raise UserInputError(f'`side_info={side_info}` is not side information of task '
                         f'{cfg.task.name!r}: {offered}; use public_clients or file:PATH')
  if cfg.task.data_dir is None:
    check_embedded_data_dir(cfg.task.embedded_data_dir)
  if task.client_ids is not None:   # Checks the data as `check_data` does, once, then reads.
    ids = task.client_ids(cfg.task.data_dir, embedded_data_dir=cfg.task.embedded_data_dir,
                          **cfg.task_options())
    if ids is not None:
      population.check_before_the_run(cfg, *ids)
  elif cfg.task.data_dir is not None and task.check_data is not None:
    task.check_data(cfg.task.data_dir, **cfg.task_options())
  if cfg.output.experiment_name is None:   # A new, timestamped name: only the root matters.
    check_writable(cfg.output.root_output_dir)
    return
  path = run_path(cfg.output.root_output_dir, cfg.output.experiment_name,
                  resume=cfg.output.resume)
  if cfg.output.resume:
    check_is_run(path)
    lock(path).close()   # Refused if another process holds it; released at once.
    resume_changes(config_lib.recorded_settings(path), cfg)
    check_rounds_left(path, cfg.training.total_rounds)
    ledger_lib.check_resumable(os.path.join(path, run_format.LEDGER_FILE))
    check_resume_state(path, cfg)


def run_path(root_output_dir: str, experiment_name: str, *, resume: bool) -> str:
  """ROOT/NAME after checking the name, that it exists exactly when `resume`, and that the
  root can hold it."""
  if not experiment_name or os.sep in experiment_name or experiment_name in ('.', '..'):
    raise UserInputError(f'invalid `experiment_name` {experiment_name!r}: use a plain name')
  # `~` expanded here, where the path is used, for every caller (shells leave `--x=~/y` alone).
  root_output_dir = os.path.expanduser(root_output_dir)
  path = os.path.join(root_output_dir, experiment_name)
  exists = os.path.isdir(path) and bool(os.listdir(path))
  if resume and not exists:
    raise UserInputError(f'`resume` given but run directory {path} does not exist')
  if not resume and exists:
    raise UserInputError(
        f'run directory {path} already exists; pass `resume` to continue it or choose '
        'another `experiment_name` (nothing was changed)')
  check_writable(root_output_dir)
  return path


def check_writable(root: str) -> None:
  """Fails early, with the reason, if run directories cannot be created under `root`, without
  creating or writing anything (a refused run leaves the file system as it was)."""
  existing = os.path.abspath(root)
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise UserInputError(f'`root_output_dir` {root} is not writable: {existing} is a file, '
                         'not a directory')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UserInputError(f'`root_output_dir` {root} is not writable: {existing} refuses '
                         'writes (permission denied)')
  try:   # Permissions say yes on /proc or /sys to root; only making a directory tells.
    os.rmdir(tempfile.mkdtemp(prefix='.tff_dp_probe_', dir=existing))
  except OSError as e:
    raise UserInputError(f'`root_output_dir` {root} is not writable: {existing} refuses new '
                         f'directories ({e.strerror or e})') from None


def check_embedded_data_dir(path: str) -> None:
  """Refuses an `embedded_data_dir` that is a file (the embedded dataset is generated into a
  directory), before TensorFlow."""
  existing = os.path.abspath(os.path.expanduser(path))
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise UserInputError(f'`embedded_data_dir` {path}: {existing} is a file, not a directory '
                         '(the embedded dataset is generated into a directory)')


def lock(path: str):
  """The open RUN_DIR/.lock, exclusively locked (close it to release).

  A second process pointed at the same run directory (a resume while the run is still going,
  or two runs started at once) is refused instead of interleaving ledger lines. The kernel
  releases the lock when the process dies, even by SIGKILL. The holder's pid is written by
  `RunDirectory.create` (a refused resume leaves .lock as it was).
  """
  f = open(os.path.join(path, LOCK_FILE), 'a+')  # pylint: disable=consider-using-with
  try:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    f.seek(0)
    owner = f.read().strip() or 'another process'
    f.close()
    raise UserInputError(f'run directory {path} is in use by {owner}; wait for it to '
                         'finish or stop it (nothing was changed)') from None
  return f


RESUMABLE_CHANGES = config_lib.RESUMABLE_SETTINGS


def settings_to_record(cfg: ExperimentConfig, task_name: str) -> dict[str, Any]:
  """The settings config.json records: every setting; `task` is the `task` setting for a
  registered task, and a user's own task object's name otherwise."""
  settings = cfg.settings()
  if not task_registry.is_registered(task_name):
    settings['task'] = task_name
  return settings


def resume_changes(recorded: dict[str, Any], cfg: ExperimentConfig,
                   task_name: Optional[str] = None) -> dict[str, tuple]:
  """{setting: (recorded value, new value)} for every setting that differs on resume.

  Raises UserInputError naming each differing setting outside `RESUMABLE_CHANGES`. Settings a
  run directory written by an older version did not record are not compared.
  """
  new = json.loads(json.dumps(   # JSON types, as recorded.
      settings_to_record(cfg, task_name if task_name is not None else cfg.task.name)))
  changes = {name: (recorded[name], value) for name, value in new.items()
             if name in recorded and name not in config_lib.PER_INVOCATION
             and recorded[name] != value}
  mechanism = mechanisms.find(cfg.dp.kind)
  planned = mechanism is not None and mechanism.noise.planned_for_rounds
  refused = {k: v for k, v in changes.items() if k not in RESUMABLE_CHANGES
             or (k == 'total_rounds' and planned)}
  if refused:
    listed = '; '.join(f'`{k}` was {old!r}, now {new_value!r}'
                       for k, (old, new_value) in refused.items())
    raise UserInputError(
        f'cannot resume {os.path.join(cfg.output.root_output_dir, cfg.output.experiment_name)} '
        f'with different settings: {listed}. A resumed run must be the same mechanism, model '
        f'and data; only {", ".join(f"`{k}`" for k in RESUMABLE_CHANGES)} may change (nothing '
        'was changed; with correlated noise not `total_rounds` either: the strategy is planned '
        'for them)')
  return changes


def check_rounds_left(path: str, total_rounds: int) -> None:
  """Refuses a resume with nothing to do (the run finished its `total_rounds`) or with fewer
  rounds than it already completed, before anything is written."""
  done = run_format.checkpointed_rounds(path)
  finished = os.path.exists(os.path.join(path, run_format.SUMMARY_FILE))
  if done > total_rounds or (finished and done == total_rounds):
    raise UserInputError(
        f'`resume`: {path} already completed {done} rounds (its last checkpoint'
        f'{", and summary.json: it finished" if finished else ""}); nothing was changed. Give '
        f'`total_rounds` above {done} to continue it')


def check_is_run(path: str) -> None:
  """Refuses to resume a directory that is not a run's (no config.json): nothing to resume. A
  run still starting (its lock held, its config not yet written) is refused as in use."""
  if not os.path.isfile(os.path.join(path, run_format.CONFIG_FILE)):
    if os.path.exists(os.path.join(path, LOCK_FILE)):
      lock(path).close()   # Refused if another process holds it.
    raise UserInputError(f'`resume`: {path} is not a run directory (it has no '
                         f'{run_format.CONFIG_FILE}); nothing was changed. Resume a directory '
                         'a run wrote, or start a run without `resume`')


def check_resume_state(path: str, cfg: ExperimentConfig) -> None:
  """Refuses, before anything is written, a resume that would silently weaken or re-charge the
  run: its ledger gone while rounds were released, its MAC key, seal or population digest gone
  while the ledger shows the run had them, a permutation sampler's key gone, or every
  checkpoint gone while the ledger holds rounds (each released round would be re-executed
  and charged again, unannounced)."""
  if mechanisms.find(cfg.dp.kind) is None:
    return
  ledger_path = os.path.join(path, run_format.LEDGER_FILE)
  macs = ledger_lib.macs_of(ledger_path) if os.path.exists(ledger_path) else []
  checkpointed = run_format.checkpointed_rounds(path)
  released = os.path.exists(os.path.join(path, run_format.METRICS_FILE))
  if not macs and (checkpointed or released):   # `released`: a round's outputs were written.
    raise UserInputError(
        f'`resume`: {ledger_path} is {"empty" if os.path.exists(ledger_path) else "missing"} '
        f'but the run released rounds ({run_format.METRICS_FILE}'
        f'{f", a checkpoint of round {checkpointed}" if checkpointed else ""}): their privacy '
        'cost would go uncounted. Restore the ledger, or start a new run (nothing was changed)')
  chained, maced = any(m.chained for m in macs), any(m.value for m in macs)
  needed = [(run_format.LEDGER_KEY_FILE, maced, 'its lines carry MACs'),
            (run_format.LEDGER_SEAL_FILE, chained, 'its lines are chained'),
            (run_format.POPULATION_DIGEST_FILE, chained, 'the run recorded its population'),
            (run_format.SAMPLING_KEY_FILE,
             sampling.get(cfg.sampling.client_sampling).keyed
             and cfg.sampling.sampling_seed is None, 'its sampler continues a secret schedule')]
  missing = [(name, why) for name, needed_now, why in needed   # What the run did have.
             if needed_now and not os.path.exists(run_format.secret_path(path, name))]
  if missing:
    raise UserInputError(
        f'`resume`: {path} lacks ' + ', '.join(
            f'{run_format.SECRET_FOLDER}/{name} ({why})' for name, why in missing)
        + ': without it the run would go on weaker (forgery or truncation of the ledger '
        'undetected, another population or schedule accepted). Restore secret/ from where '
        'you keep it, or start a new run (nothing was changed)')
  last_released = max((int(r['round']) for r in metrics_csv.MetricsCsv(
      os.path.join(path, run_format.METRICS_FILE)).read_rows()), default=0)
  # A round that is a multiple of the checkpoint period is checkpointed before its outputs are
  # released, so a crash leaves fewer than `every` released rounds after the last checkpoint;
  # a finished run checkpointed its last round.
  every = min(cfg.rounds_per_checkpoint,
              config_lib.resumed(config_lib.recorded_settings(path), {}).rounds_per_checkpoint)
  finished = os.path.exists(os.path.join(path, run_format.SUMMARY_FILE))
  removed = last_released - checkpointed >= every or (finished and checkpointed < last_released)
  if removed and not cfg.output.rerun_released_rounds:
    raise UserInputError(
        f'`resume`: {path} released {last_released} rounds but holds '
        + (f'a checkpoint of round {checkpointed} only' if checkpointed else 'no checkpoint')
        + f' (one every {every} rounds, and the last of a finished run, is '
        f'written before its release, so checkpoints were removed): rounds '
        f'{checkpointed + 1}-{last_released} would be executed and charged again. Restore '
        'checkpoints/, give `rerun_released_rounds` to re-execute them (each charged again), '
        'or start a new run (nothing was changed)')
