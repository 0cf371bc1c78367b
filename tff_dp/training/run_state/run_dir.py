"""The run directory: config, metrics CSV, TensorBoard, checkpoints; never clobbers a prior run.

Layout of RUN_DIR = root_output_dir/experiment_name (what each output is, privacy-wise, is
declared in `tff_dp.run_format.release`):
  config.json        the flags/config of the run (each resume appends to config_history.jsonl)
  metrics.csv        one row per round (columns grow as eval/aggregate metrics appear)
  ledger.jsonl       the privacy ledger (tff_dp.ledger)
  checkpoints/       tff.program.FileProgramStateManager program states
  secret/            (mode 0700) keys, the checkpoints of mechanisms whose noise spans
                     rounds, correlated noise's snapshots
  tensorboard/       tf.summary scalars (not written with private_release: wall-clock times)
  plots/             PNGs written by the run
  release/           private_release: the publishable set
"""

import asyncio
import contextlib
import fcntl
import json
import os
import time
from typing import Any, Mapping, Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
# Not re-exported under tff.*: the interface TFF's FileProgramStateManager serializes on save.
from tensorflow_federated.python.common_libs import serializable

from tff_dp import atomic_write
from tff_dp import errors
from tff_dp import run_format
from tff_dp.errors import UserInputError
from tff_dp.run_format import metrics_csv
from tff_dp.run_format import release
from tff_dp.training import config as config_lib
from tff_dp.training import preflight

_KEEP_CHECKPOINTS = 3
SECRET_DIR = release.SECRET_DIR


def restrict_secrets(folder: str) -> None:
  """Makes every file under `folder` owner-only (0600, folders 0700): TFF writes checkpoints
  0644, and a copy of one out of secret/ must not carry its noise state readable by all."""
  for path, folders, files in os.walk(folder):
    for name in folders:
      os.chmod(os.path.join(path, name), 0o700)
    for name in files:
      os.chmod(os.path.join(path, name), 0o600)


class _StateModule(tf.Module):
  """What TFF's FileProgramStateManager saves: a module whose `__call__` returns the state."""

  def __init__(self, value):
    super().__init__()
    self._value = value

  @tf.function(input_signature=())
  def __call__(self):
    return self._value


def _as_variable(leaf):
  try:
    # Of unknown shape, so that a later state whose leaf has another shape of the same rank is
    # assigned into it and the module is reused: DP-FTRL's tree buffers gain a level as the
    # tree grows (their first dimension changes every few rounds), past-k buffers fill up.
    return tf.Variable(leaf, shape=tf.TensorShape(None))
  except ValueError:
    return leaf   # What TFF's write_saved_model does with it.


def _leaf_layout(value) -> tuple:
  """What a reused variable must keep: dtype and rank (not the shape: see `_as_variable`)."""
  value = np.asarray(value)
  kind = 'string' if value.dtype.kind in 'SUO' else value.dtype.str
  return kind, value.ndim


class ReusingFileProgramStateManager(tff.program.FileProgramStateManager):
  """`tff.program.FileProgramStateManager` whose saves reuse one module while the state's
  layout (structure, dtypes, ranks) stays the same.

  Why not TFF's save: it wraps every value in a new tf.Variable and saves a new module whose
  tf.function is traced again. In TF 2.14 a tf.function traced over variables that are then
  deleted keeps part of their memory alive (measured: about a third of the bytes, 6.5 MB per
  EMNIST checkpoint), so the coordinator grew with every checkpoint (issue 13). Here the
  variables and the traced module are made once per layout and each save assigns the new
  values before `tf.saved_model.save`. The files are those TFF writes (the same module, the
  same temp-directory-then-rename), and TFF's own `load`/`load_latest` read them.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._module = None      # The reused module, its variables (flat), the state's
    self._variables = None   # containers (leaves None) and leaf layouts it was made for.
    self._template = None
    self._layout: Optional[list] = None

  async def save(self, program_state, version: int) -> None:
    # TFF 0.87's save, with `_write` in place of `file_utils.write_saved_model`.
    path = self._get_path_for_version(version)
    if await tff.program.file_utils.exists(path):
      raise tff.program.ProgramStateExistsError(version=version, path=self._root_dir)
    value = await tff.program.materialize_value(program_state)
    value = tff.program.structure_utils.map_structure(
        lambda v: v.to_bytes() if isinstance(v, serializable.Serializable) else v, value)
    self._write(value, path)
    await self._remove_old_program_state()

  def _write(self, value, path: str) -> None:
    leaves = tff.program.structure_utils.flatten(value)
    layout = [_leaf_layout(leaf) for leaf in leaves]
    if self._same_layout(value, layout):
      for variable, leaf in zip(self._variables, leaves):
        variable.assign(leaf)
      module = self._module
    else:
      self._module = self._variables = self._template = None   # Freed before new ones exist.
      variables = [_as_variable(leaf) for leaf in leaves]
      module = _StateModule(tff.program.structure_utils.unflatten_as(value, variables))
      # A leaf TFF cannot make a variable (kept as is, traced as a constant) would be frozen in
      # a reused module: such a state is written afresh each time, as TFF does.
      if all(isinstance(v, tf.Variable) for v in variables):
        self._module, self._variables, self._layout = module, variables, layout
        self._template = tff.program.structure_utils.map_structure(lambda _: None, value)
    temp_path = f'{path}_temp{os.getpid()}'
    if tf.io.gfile.exists(temp_path):
      tf.io.gfile.rmtree(temp_path)
    tf.io.gfile.makedirs(temp_path)
    tf.saved_model.save(module, temp_path, signatures={})
    tf.io.gfile.rename(temp_path, path)

  def _same_layout(self, value, layout) -> bool:
    if self._module is None or layout != self._layout:
      return False
    try:
      # Raises if the containers differ (types included), not only the leaves.
      tff.program.structure_utils.map_structure(lambda *_: None, self._template, value)
    except (TypeError, ValueError):
      return False
    return True


@contextlib.contextmanager
def writing(what: str, where: str):
  """Turns a failed write (disk full, permissions) into a RunFailedError naming it."""
  try:
    yield
  except (OSError, tf.errors.OpError) as e:
    reason = getattr(e, 'strerror', None) or getattr(e, 'message', None) or str(e)
    reason = ' '.join(str(reason).split())
    if len(reason) > 300:   # TF puts the cause (e.g. "No space left on device") at the end.
      reason = reason[:80] + ' ... ' + reason[-200:]
    raise errors.RunFailedError(
        f'could not write {what} in {where}: {reason}. Files '
        'written before are intact; fix the cause (free disk space, permissions) and rerun '
        'with `resume`') from e


class RunDirectory:
  """Creates or reopens RUN_DIR; all run outputs go through this object."""

  def __init__(self, root_output_dir: str, experiment_name: str, *, resume: bool):
    # The checks are `preflight`'s, which the command line makes before TensorFlow loads.
    self.path = preflight.run_path(root_output_dir, experiment_name, resume=resume)
    self.resume = resume
    self._created = False
    self._lock_file = None
    if resume:
      self._lock()   # Before anything of the existing run is read.

  def _lock(self) -> None:
    """Holds the exclusive lock on RUN_DIR/.lock for the life of this process
    (`preflight.lock`)."""
    self._lock_file = preflight.lock(self.path)

  def close(self) -> None:
    """Releases the lock and flushes TensorBoard (the process may start or resume runs again)."""
    if self._created and self._summary_writer is not None:
      self._summary_writer.close()
    if self._lock_file is not None:
      self._lock_file.close()   # Closing the descriptor releases the flock.
      self._lock_file = None

  def create(self, *, secret_checkpoints: bool = False, tensorboard: bool = True) -> None:
    """Creates the directory tree; called only after all inputs were validated.

    `secret_checkpoints`: checkpoints hold the mechanism's noise state and go under secret/
    (a run directory written before secret/ existed keeps its checkpoints/ on resume).
    `tensorboard`: write TensorBoard events (their wall-clock times are timings).
    """
    checkpoints = 'checkpoints'
    if secret_checkpoints and not self._has_checkpoints('checkpoints'):
      checkpoints = os.path.join(SECRET_DIR, 'checkpoints')
    try:
      os.makedirs(self.path, exist_ok=True)
      if self._lock_file is None:
        self._lock()
      self._lock_file.seek(0)
      self._lock_file.truncate()
      self._lock_file.write(f'pid {os.getpid()}\n')
      self._lock_file.flush()
      os.makedirs(self.file(SECRET_DIR), mode=0o700, exist_ok=True)
      os.chmod(self.file(SECRET_DIR), 0o700)
      for sub in (checkpoints, 'plots') + (('tensorboard',) if tensorboard else ()):
        os.makedirs(os.path.join(self.path, sub), exist_ok=True)
    except OSError as e:
      raise UserInputError(f'cannot create run directory {self.path}: {e.strerror or e}') from e
    self.metrics = metrics_csv.MetricsCsv(self.file(run_format.METRICS_FILE))
    self.state_manager = ReusingFileProgramStateManager(
        self.file(checkpoints), prefix=run_format.CHECKPOINT_PREFIX, keep_total=_KEEP_CHECKPOINTS, keep_first=False)
    self._summary_writer = (tf.summary.create_file_writer(self.file('tensorboard'))
                            if tensorboard else None)
    self._created = True

  def _has_checkpoints(self, sub: str) -> bool:
    folder = self.file(sub)
    return os.path.isdir(folder) and any(n.startswith('round_') for n in os.listdir(folder))

  def secret_file(self, name: str) -> str:
    """RUN_DIR/secret/`name`; for a run directory written before secret/ existed, its old
    `name`.secret beside the checkpoints when that exists (a resume reads the key there)."""
    return run_format.secret_path(self.path, name)

  def file(self, name: str) -> str:
    return os.path.join(self.path, name)

  def write_config(self, config: Mapping[str, Any],
                   changes: Optional[Mapping[str, tuple]] = None) -> None:
    """Writes config.json (the run's settings, updated by allowed changes on resume) and
    appends the settings to config_history.jsonl, with what a resume changed."""
    entry = dict(config, _written_at=time.strftime('%Y-%m-%dT%H:%M:%S'))
    if not os.path.exists(self.file(run_format.CONFIG_FILE)) or changes:
      atomic_write.write_text(self.file(run_format.CONFIG_FILE),
                             json.dumps(entry, indent=2, sort_keys=True))
    if changes:
      entry['_changed_on_resume'] = {k: {'was': old, 'now': new}
                                     for k, (old, new) in changes.items()}
    with open(self.file(run_format.CONFIG_HISTORY_FILE), 'a') as f:
      f.write(json.dumps(entry, sort_keys=True) + '\n')

  def write_json(self, name: str, obj: Mapping[str, Any]) -> None:
    atomic_write.write_text(self.file(name), json.dumps(dict(obj), indent=2, sort_keys=True))

  def read_config(self) -> dict[str, Any]:
    """The recorded settings of an existing run ({} if it has no config.json yet)."""
    return config_lib.recorded_settings(self.path)

  def write_summaries(self, round_num: int, scalars: Mapping[str, float]) -> None:
    if self._summary_writer is None:
      return
    with self._summary_writer.as_default():
      for name, value in scalars.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
          tf.summary.scalar(name, value, step=round_num)
    self._summary_writer.flush()

  def save_checkpoint(self, program_state, round_num: int) -> None:
    asyncio.run(self.state_manager.save(program_state, round_num))
    restrict_secrets(self.file(SECRET_DIR))

  def load_latest_checkpoint(self, structure):
    """Returns (program_state, round_num) or (None, 0) if no checkpoint exists."""
    state, version = asyncio.run(self.state_manager.load_latest(structure))
    return (state, version) if state is not None else (None, 0)
