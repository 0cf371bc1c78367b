"""EMNIST character recognition: TFF's loader, preprocessing and `cnn_dropout` CNN."""

from typing import Optional

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines.emnist import emnist_models
from tensorflow_federated.python.simulation.baselines.emnist import emnist_preprocessing

from tasks import data_files
from tasks import sql_client_data
from tasks.base import FederatedTask
from tff_dp.errors import UserInputError

DB_NAME = data_files.DATABASES['emnist']   # What tff.simulation.datasets.emnist.load_data reads.


def build(data_dir: str, client_spec: tff.simulation.baselines.ClientSpec,
          only_digits: bool = False, shuffle_seed: Optional[int] = None) -> FederatedTask:
  """EMNIST-62 (or -10 with only_digits) via `tff.simulation.datasets.emnist.load_data`."""
  if not isinstance(only_digits, bool):
    raise UserInputError(f'emnist only_digits must be True or False, got {only_digits!r}')
  data_files.check_task_data('emnist', data_dir, only_digits)
  train, test = tff.simulation.datasets.emnist.load_data(
      only_digits=only_digits, cache_dir=data_dir)
  # TFF pastes client ids into SQL text; read each client with an exact query instead.
  train, test = sql_client_data.safe_client_data(train), sql_client_data.safe_client_data(test)
  eval_spec = tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=100,
                                                  shuffle_buffer_size=1)
  return FederatedTask(
      name='emnist',
      train_data=train,
      traceable_train_data=True,   # sql_client_data reads a traced id.
      test_data=test,
      # TFF's `debug_seed` seeds the shuffle and makes the parallel map order deterministic.
      preprocess_train=emnist_preprocessing.create_preprocess_fn(client_spec,
                                                                 debug_seed=shuffle_seed),
      preprocess_eval=emnist_preprocessing.create_preprocess_fn(eval_spec),
      keras_model_fn=lambda: emnist_models.create_conv_dropout_model(only_digits=only_digits),
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(),
      metrics_fn=lambda: [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')],
  )
