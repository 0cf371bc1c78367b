"""Benchmark tasks (EMNIST, StackOverflow next-word and tag prediction) on TFF's loaders."""

import inspect
import os
from typing import Optional

import tensorflow_federated as tff

from tasks.base import FederatedTask
from tff_dp.errors import UserInputError

__all__ = ['TASK_NAMES', 'FederatedTask', 'build_task']

TASK_NAMES = ('emnist', 'stackoverflow_word', 'stackoverflow_tag')


def build_task(name: str, data_dir: str, *, client_batch_size: int = 20,
               client_epochs: int = 1, max_elements_per_client: Optional[int] = None,
               shuffle_buffer_size: Optional[int] = None, shuffle_seed: Optional[int] = None,
               **task_options) -> FederatedTask:
  """Builds task `name` from the TFF cache in `data_dir` (never downloads).

  `shuffle_seed` (optional) makes the client-side shuffle of `preprocess_train` reproducible;
  `task_options` are the task's own options (see `tasks.emnist.build`,
  `tasks.stackoverflow.build_word_prediction` / `build_tag_prediction`).
  """
  if name not in TASK_NAMES:
    raise UserInputError(f'unknown `task` {name!r}; choose one of {", ".join(TASK_NAMES)}')
  if client_batch_size < 1 or client_epochs < 1:
    raise UserInputError('client batch size and epochs must be positive')
  if max_elements_per_client is not None and max_elements_per_client < 1:
    raise UserInputError('max_elements_per_client must be positive when set')
  spec = tff.simulation.baselines.ClientSpec(
      num_epochs=client_epochs, batch_size=client_batch_size,
      max_elements=max_elements_per_client, shuffle_buffer_size=shuffle_buffer_size)
  # pylint: disable=g-import-not-at-top
  if name == 'emnist':
    from tasks import emnist
    builder = emnist.build
  else:
    from tasks import stackoverflow
    builder = (stackoverflow.build_word_prediction if name == 'stackoverflow_word'
               else stackoverflow.build_tag_prediction)
  allowed = set(inspect.signature(builder).parameters) - {'data_dir', 'client_spec',
                                                          'shuffle_seed'}
  unknown = sorted(set(task_options) - allowed)
  if unknown:
    raise UserInputError(f'task {name!r} has no option(s) {unknown}; valid: {sorted(allowed)}')
  # `~` expanded here, where the path is used, for every caller (shells leave `--x=~/y` alone).
  return builder(os.path.expanduser(data_dir), spec, shuffle_seed=shuffle_seed, **task_options)
