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
  # train_data.serializable_dataset_fn accepts a traced client id (tasks.sql_client_data):
  # `train_dataset_for_client` then builds every client's pipeline with one traced function.
  traceable_train_data: bool = False

  @functools.cached_property
  def _traced_train_dataset_fn(self):
    read = self.train_data.serializable_dataset_fn
    return tf.function(lambda client_id: self.preprocess_train(read(client_id)),
                       input_signature=[tf.TensorSpec([], tf.string)])

  @functools.cached_property
  def train_dataset_computation(self):
    """`tff.Computation` (tf.string -> preprocessed training dataset): TFF's
    `ClientData.dataset_computation` with `preprocess_train` inside, for
    `tff.simulation.compose_dataset_computation_with_learning_process` (datasets built on the
    workers from client ids).

    The id reaches SQL only hex-encoded by graph ops (`tasks.sql_client_data`): TFF's own
    `SqlClientData.dataset_computation` would paste the id tensor into the query text
    (`tf.strings.join`), so an id holding `'` selects other clients' rows. Same elements as
    `train_dataset_for_client`: the computation is traced in a fresh graph, whose seed is set
    to the global seed in force now, so the seeded shuffles draw the same orders as in the
    eager / `tf.function` pipeline (a `tf.function` graph inherits the global seed).
    """
    if not self.traceable_train_data:
      raise ValueError(f'task {self.name!r} cannot read a client from a traced id')
    read = self.train_data.serializable_dataset_fn
    graph_seed = tf.compat.v1.get_seed(0)[0]   # (global seed or TF's default graph seed, 0)

    @tff.tensorflow.computation(tf.string)
    def dataset_computation(client_id):
      tf.compat.v1.set_random_seed(graph_seed)
      return self.preprocess_train(read(client_id))

    return dataset_computation

  @functools.cached_property
  def _train_client_ids(self) -> frozenset:
    return frozenset(self.train_data.client_ids)

  def train_dataset_for_client(self, client_id) -> tf.data.Dataset:
    """`preprocess_train(train_data.create_tf_dataset_for_client(client_id))`: the same
    elements, built faster where the data allows it.

    Built eagerly, each client's pipeline re-traces the preprocessing's map functions (and, for
    StackOverflow, rebuilds its vocabulary table from a Python list): measured 26 ms (EMNIST)
    and 115-215 ms (StackOverflow, 10,000 words) per client on a loaded 2-core machine, paid on
    the round loop's prefetch thread beside the round. One function traced with the id as a
    string tensor returns the same pipeline for ~2 ms.
    """
    if not self.traceable_train_data or client_id not in self._train_client_ids:
      # (An unknown id gets ClientData's own error.)
      return self.preprocess_train(self.train_data.create_tf_dataset_for_client(client_id))
    return self._traced_train_dataset_fn(tf.constant(client_id, tf.string))

  @functools.cached_property
  def input_spec(self):
    """Element spec of a preprocessed training dataset (computed once: it reads a client)."""
    example = self.train_data.create_tf_dataset_for_client(self.train_data.client_ids[0])
    return self.preprocess_train(example).element_spec

  def model_fn(self) -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        self.keras_model_fn(), loss=self.loss_fn(), input_spec=self.input_spec,
        metrics=self.metrics_fn())
