"""The repository's tasks (the `task` setting's choices once `tasks` is imported), where each is
built from, and their settings (`TaskSettings`, a config section of its own).

Pure Python (no TensorFlow), so that a configuration is checked against it before TF loads.
"""

import dataclasses
from typing import Mapping

from tff_dp import sections
from tff_dp.training import task_registry


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """Where a task's builder lives, its dataset family, and which settings are its options."""
  help: str
  module: str          # tasks.<module>
  builder: str         # its function (data_dir, client_spec, shuffle_seed=..., **options)
  family: str          # dataset family of `tasks.synthetic_data` (the embedded dataset)
  # The builder's own options: keyword -> the setting that gives it (a field of
  # `TaskSettings`: a flag and a config.json key).
  options: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # The token-frequency side information it has public counts and a model for.
  side_info: tuple = ()


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
        {'word_vocab_size': 'so_vocab_size', 'tag_vocab_size': 'so_tag_vocab_size'},
        side_info=('word_freq', 'tag_freq')),
}
TASK_NAMES = tuple(TASKS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSettings(sections.Section):
  """Settings of the repository's tasks: the EMNIST classes, the StackOverflow vocabularies and
  model sizes (each task's builder options name the ones it takes, `TASKS[name].options`)."""
  SECTION = 'task_options'   # Its group of flags, after the `task` section.
  FOLLOWS = 'task'
  emnist_only_digits: bool = sections.setting(
      False, 'EMNIST: 10 digit classes instead of all 62 characters.')
  so_vocab_size: int = sections.setting(
      10000, 'StackOverflow: word vocabulary size (most frequent words).',
      check=sections.at_least(1))
  so_tag_vocab_size: int = sections.setting(
      500, 'StackOverflow tag prediction: number of tags predicted.',
      check=sections.at_least(1))
  so_sequence_length: int = sections.setting(
      20, 'StackOverflow next-word prediction: tokens per sequence.',
      check=sections.at_least(1))
  so_embedding_size: int = sections.setting(
      96, 'StackOverflow next-word prediction: word embedding size (and of the dense layer '
      'before the output), 96 in the literature\'s model.', check=sections.at_least(1))
  so_lstm_size: int = sections.setting(
      670, 'StackOverflow next-word prediction: LSTM units, 670 in the literature\'s model.',
      check=sections.at_least(1))


# Where `load` generates the embedded dataset when no data directory is given.
DEFAULT_EMBEDDED_DATA_DIR = task_registry.DEFAULT_EMBEDDED_DATA_DIR
