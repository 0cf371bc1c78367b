"""The one list of tasks (the `task` setting's choices) and where each is built from.

Pure Python (no TensorFlow), so that a configuration is checked against it before TF loads.
"""

import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Where a task's builder lives and which dataset family its data belongs to."""
  help: str
  module: str          # tasks.<module>
  builder: str         # its function (data_dir, client_spec, shuffle_seed=..., **options)
  family: str          # dataset family of `tasks.synthetic_data` (the embedded dataset)


TASKS = {
    'emnist': TaskSpec('EMNIST character recognition, CNN', 'emnist', 'build', 'emnist'),
    'stackoverflow_word': TaskSpec('StackOverflow next-word prediction, LSTM', 'stackoverflow',
                                   'build_word_prediction', 'stackoverflow'),
    'stackoverflow_tag': TaskSpec('StackOverflow tag prediction, logistic regression',
                                  'stackoverflow', 'build_tag_prediction', 'stackoverflow'),
}
TASK_NAMES = tuple(TASKS)
# Where `load` generates the embedded dataset when no data directory is given.
DEFAULT_EMBEDDED_DATA_DIR = os.path.join('data_cache', 'embedded')
