"""The task interface the library consumes (docs/ARCHITECTURE.md, Contract 3)."""

import dataclasses
import functools
from typing import Any, Callable, Optional

import tensorflow as tf
import tensorflow_federated as tff


@dataclasses.dataclass
class FederatedTask:
  """Data (TFF ClientData from the real loaders), preprocessing and model of one task."""
  name: str
  train_data: Any                       # tff.simulation.datasets.ClientData (raw examples)
  test_data: Any
  preprocess_train: Callable[[tf.data.Dataset], tf.data.Dataset]
  preprocess_eval: Callable[[tf.data.Dataset], tf.data.Dataset]
  keras_model_fn: Callable[[], tf.keras.Model]
  loss_fn: Callable[[], tf.keras.losses.Loss]
  metrics_fn: Callable[[], list]        # includes one metric named 'accuracy'
  word_counts: Optional[dict] = None    # public side information (StackOverflow)
  tag_counts: Optional[dict] = None
  vocab: Optional[list] = None

  @functools.cached_property
  def input_spec(self):
    """Element spec of a preprocessed training dataset (computed once: it reads a client)."""
    example = self.train_data.create_tf_dataset_for_client(self.train_data.client_ids[0])
    return self.preprocess_train(example).element_spec

  def model_fn(self) -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        self.keras_model_fn(), loss=self.loss_fn(), input_spec=self.input_spec,
        metrics=self.metrics_fn())
