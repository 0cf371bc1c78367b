"""Benchmark tasks (EMNIST, StackOverflow next-word and tag prediction) on TFF's loaders.

Importing this package registers its tasks with the library (`tff_dp.training.task_registry`:
the `task` setting's choices) and their settings (`TaskSettings`, the config section
`task_options`); the library itself never imports it. `TASKS` lists them. No TensorFlow at the
top, so that a configuration can be checked before TF is loaded (the command line reports a bad
flag in a second); building a task imports it.
"""

import functools
import importlib
import inspect
import os
from typing import Optional

from tasks.registry import DEFAULT_EMBEDDED_DATA_DIR
from tasks.registry import TASK_NAMES
from tasks.registry import TASKS
from tasks.registry import TaskSettings
from tasks.registry import TaskSpec
from tff_dp.errors import UserInputError
from tff_dp import sections
from tff_dp.training import task_registry

__all__ = ['TASKS', 'TASK_NAMES', 'TaskSettings', 'TaskSpec', 'DEFAULT_EMBEDDED_DATA_DIR',
           'FederatedTask', 'build_task', 'check_data', 'client_ids', 'load']


def __getattr__(name):
  if name == 'FederatedTask':   # Imports TensorFlow: only when asked for.
    from tasks.base import FederatedTask  # pylint: disable=g-import-not-at-top
    return FederatedTask
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def _spec(name: str) -> TaskSpec:
  if name not in TASKS:
    raise UserInputError(f'unknown `task` {name!r}; choose one of {", ".join(TASKS)}')
  return TASKS[name]


def build_task(name: str, data_dir: str, *, client_batch_size: int = 20,
               client_epochs: int = 1, max_elements_per_client: Optional[int] = None,
               shuffle_buffer_size: Optional[int] = None, shuffle_seed: Optional[int] = None,
               **task_options):
  """Builds task `name` (a `tasks.base.FederatedTask`) from the TFF cache in `data_dir` (never
  downloads).

  `shuffle_seed` (optional) makes the client-side shuffle of `preprocess_train` reproducible;
  `task_options` are the task's own options (see `tasks.emnist.build`,
  `tasks.stackoverflow.build_word_prediction` / `build_tag_prediction`).
  """
  spec = _spec(name)
  if client_batch_size < 1 or client_epochs < 1:
    raise UserInputError('client batch size and epochs must be positive')
  if max_elements_per_client is not None and max_elements_per_client < 1:
    raise UserInputError('max_elements_per_client must be positive when set')
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top  (start-up time)
  spec_ = tff.simulation.baselines.ClientSpec(
      num_epochs=client_epochs, batch_size=client_batch_size,
      max_elements=max_elements_per_client, shuffle_buffer_size=shuffle_buffer_size)
  builder = getattr(importlib.import_module(f'tasks.{spec.module}'), spec.builder)
  allowed = set(inspect.signature(builder).parameters) - {'data_dir', 'client_spec',
                                                          'shuffle_seed'}
  unknown = sorted(set(task_options) - allowed)
  if unknown:
    raise UserInputError(f'task {name!r} has no option(s) {unknown}; valid: {sorted(allowed)}')
  # `~` expanded here, where the path is used, for every caller (shells leave `--x=~/y` alone).
  return builder(os.path.expanduser(data_dir), spec_, shuffle_seed=shuffle_seed,
                 **task_options)


def check_data(name: str, data_dir: str, **task_options) -> None:
  """Refuses (UserInputError) a `data_dir` that lacks task `name`'s intact SQLite file or its
  splits; imports no TensorFlow."""
  from tasks import data_files  # pylint: disable=g-import-not-at-top
  data_files.check_task_data(_spec(name).family, os.path.expanduser(data_dir),
                             only_digits=bool(task_options.get('only_digits', False)))


def load(name: str, data_dir: Optional[str] = None, *,
         embedded_data_dir: str = DEFAULT_EMBEDDED_DATA_DIR, **build_options):
  """`build_task` from `data_dir`, or, when it is None, from the embedded synthetic dataset,
  generated deterministically into `embedded_data_dir` if not there yet (no download)."""
  _spec(name)
  if data_dir is None:
    from tasks import synthetic_data  # pylint: disable=g-import-not-at-top  (imports TF)
    data_dir = synthetic_data.ensure_default_cache(embedded_data_dir, name)
  return build_task(name, data_dir, **build_options)


def client_ids(name: str, data_dir: Optional[str] = None, *,
               embedded_data_dir: str = DEFAULT_EMBEDDED_DATA_DIR,
               **task_options) -> Optional[tuple[list, list]]:
  """The (training, test) client ids `load` would give task `name`, read without TensorFlow;
  None when no data directory is given and the embedded dataset is not generated yet."""
  from tasks import data_files  # pylint: disable=g-import-not-at-top
  family = _spec(name).family
  if data_dir is None:
    data_dir = data_files.embedded_dir_if_generated(family, embedded_data_dir)
    if data_dir is None:
      return None
  return data_files.client_ids(family, os.path.expanduser(data_dir),
                               only_digits=bool(task_options.get('only_digits', False)))


def _register() -> None:
  """Registers `TaskSettings` and each task of `TASKS` with the library."""
  sections.register(TaskSettings)
  for name, spec in TASKS.items():
    task_registry.register(name, task_registry.RegisteredTask(
        help=spec.help, build=functools.partial(load, name),
        check_data=functools.partial(check_data, name),
        client_ids=functools.partial(client_ids, name), options=spec.options,
        token_side_info=frozenset(spec.side_info)))


_register()
