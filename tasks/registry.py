"""The one list of tasks (the `task` setting's choices) and where each is built from.

Pure Python (no TensorFlow), so that a configuration is checked against it before TF loads.
"""

import dataclasses
import os
from typing import Any, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class TaskSetting:
  """A setting a task declares for its options: its flat name (flag, config.json key), type,
  default, help and lower bound. The run's task config gets one field per setting
  (`tff_dp.training.config.TaskConfig`), so the library's config names none of them."""
  name: str
  type: type
  default: Any
  help: str
  minimum: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Where a task's builder lives, its dataset family, and which settings are its options."""
  help: str
  module: str          # tasks.<module>
  builder: str         # its function (data_dir, client_spec, shuffle_seed=..., **options)
  family: str          # dataset family of `tasks.synthetic_data` (the embedded dataset)
  # The builder's own options: keyword -> the setting that gives it (a `TASK_SETTINGS` name:
  # a field of the run's task config and its flag).
  options: Mapping[str, str] = dataclasses.field(default_factory=dict)


TASKS = {
    'emnist': TaskSpec('EMNIST character recognition, CNN', 'emnist', 'build', 'emnist',
                       {'only_digits': 'emnist_only_digits'}),
    'stackoverflow_word': TaskSpec(
        'StackOverflow next-word prediction, LSTM', 'stackoverflow', 'build_word_prediction',
        'stackoverflow', {'vocab_size': 'so_vocab_size', 'sequence_length': 'so_sequence_length',
                          'embedding_size': 'so_embedding_size', 'latent_size': 'so_lstm_size'}),
    'stackoverflow_tag': TaskSpec(
        'StackOverflow tag prediction, logistic regression', 'stackoverflow',
        'build_tag_prediction', 'stackoverflow',
        {'word_vocab_size': 'so_vocab_size', 'tag_vocab_size': 'so_tag_vocab_size'}),
}
# The settings the tasks' options come from, one declaration each (shared ones, like the
# StackOverflow word vocabulary, are the option of several tasks).
TASK_SETTINGS = (
    TaskSetting('emnist_only_digits', bool, False,
                'EMNIST: 10 digit classes instead of all 62 characters.'),
    TaskSetting('so_vocab_size', int, 10000,
                'StackOverflow: word vocabulary size (most frequent words).', minimum=1),
    TaskSetting('so_tag_vocab_size', int, 500,
                'StackOverflow tag prediction: number of tags predicted.', minimum=1),
    TaskSetting('so_sequence_length', int, 20,
                'StackOverflow next-word prediction: tokens per sequence.', minimum=1),
    TaskSetting('so_embedding_size', int, 96,
                'StackOverflow next-word prediction: word embedding size (and of the dense '
                'layer before the output), 96 in the literature\'s model.', minimum=1),
    TaskSetting('so_lstm_size', int, 670,
                'StackOverflow next-word prediction: LSTM units, 670 in the literature\'s '
                'model.', minimum=1),
)
TASK_NAMES = tuple(TASKS)
# Where `load` generates the embedded dataset when no data directory is given.
DEFAULT_EMBEDDED_DATA_DIR = os.path.join('data_cache', 'embedded')
