"""Benchmark tasks (EMNIST, StackOverflow next-word and tag prediction) on TFF's loaders."""

from typing import Optional

import tensorflow_federated as tff

from tasks.base import FederatedTask
from tff_dp.errors import UserInputError

TASK_NAMES = ('emnist', 'stackoverflow_word', 'stackoverflow_tag')


def build_task(name: str, data_dir: str, *, client_batch_size: int = 20,
               client_epochs: int = 1, max_elements_per_client: Optional[int] = None,
               shuffle_buffer_size: Optional[int] = None, shuffle_seed: Optional[int] = None,
               **task_options) -> FederatedTask:
  """Builds task `name` from the TFF cache in `data_dir` (never downloads)."""
  del shuffle_seed  # Client-side shuffling follows TF's global seed (set by the runner).
  if name not in TASK_NAMES:
    raise UserInputError(f'unknown --task {name!r}; choose one of {", ".join(TASK_NAMES)}')
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
    return emnist.build(data_dir, spec, **task_options)
  from tasks import stackoverflow
  if name == 'stackoverflow_word':
    return stackoverflow.build_word_prediction(data_dir, spec, **task_options)
  return stackoverflow.build_tag_prediction(data_dir, spec, **task_options)
