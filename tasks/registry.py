"""The one list of tasks (the `task` setting's choices) and where each is built from.

Pure Python (no TensorFlow), so that a configuration is checked against it before TF loads.
"""

import dataclasses
import os
from typing import Mapping


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Where a task's builder lives, its dataset family, and which settings are its options."""
  help: str
  module: str          # tasks.<module>
  builder: str         # its function (data_dir, client_spec, shuffle_seed=..., **options)
  family: str          # dataset family of `tasks.synthetic_data` (the embedded dataset)
  # The builder's own options: keyword -> the setting that gives it (a field of the run's
  # task config, `tff_dp.training.config.TaskConfig`, and its flag).
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
TASK_NAMES = tuple(TASKS)
# Where `load` generates the embedded dataset when no data directory is given.
DEFAULT_EMBEDDED_DATA_DIR = os.path.join('data_cache', 'embedded')
