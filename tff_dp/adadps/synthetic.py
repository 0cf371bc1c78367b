"""Seeded synthetic sparse linear regression in the spirit of the AdaDPS toy example (Sec. 4.1).

The first `frequent_fraction` of the binary features are frequent (present with probability
`p_frequent`) and uninformative (true weight 0); the rest are rare (`p_rare`) and informative
(true weight ~ N(1, 0.5^2)); y = <w*, x> + N(0, noise^2). Plain SGD moves the rare coordinates
slowly because they appear in few examples; the frequency side information lets AdaDPS take
larger steps on them. The public "word counts" are the expected feature counts, so the same
`token_frequency_side_info` path as for StackOverflow is exercised.
"""

import collections
import dataclasses

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


@dataclasses.dataclass
class SparseLinearTask:
  """Clients' arrays plus the TFF/Keras model builders for the synthetic task."""
  x: np.ndarray        # [num_clients, examples_per_client, num_features] float32
  y: np.ndarray        # [num_clients, examples_per_client, 1] float32
  true_weights: np.ndarray
  feature_counts: 'collections.OrderedDict[str, int]'  # public side information
  batch_size: int

  @property
  def num_clients(self) -> int:
    return self.x.shape[0]

  @property
  def num_features(self) -> int:
    return self.x.shape[2]

  def client_dataset(self, i: int) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((self.x[i], self.y[i])).batch(self.batch_size)

  def keras_model_fn(self) -> tf.keras.Model:
    return tf.keras.Sequential([tf.keras.layers.Dense(
        1, use_bias=False, kernel_initializer='zeros', input_shape=(self.num_features,))])

  def loss_fn(self) -> tf.keras.losses.Loss:
    return tf.keras.losses.MeanSquaredError()

  def model_fn(self) -> tff.learning.models.VariableModel:
    return tff.learning.models.from_keras_model(
        self.keras_model_fn(), loss=self.loss_fn(),
        input_spec=self.client_dataset(0).element_spec)

  def loss(self, kernel: np.ndarray) -> float:
    """Mean squared error of a [num_features, 1] kernel over all clients' data."""
    x = self.x.reshape(-1, self.num_features)
    return float(np.mean((x @ np.asarray(kernel).reshape(-1, 1) - self.y.reshape(-1, 1)) ** 2))


def make_sparse_linear_task(seed: int = 0, num_features: int = 100,
                            frequent_fraction: float = 0.1, p_frequent: float = 0.9,
                            p_rare: float = 0.05, num_clients: int = 200,
                            examples_per_client: int = 20, batch_size: int = 10,
                            noise: float = 0.1) -> SparseLinearTask:
  """Builds the seeded task (defaults: 100 features, 10 frequent, 200 clients x 20 examples)."""
  rng = np.random.default_rng(seed)
  num_frequent = int(round(frequent_fraction * num_features))
  p = np.r_[np.full(num_frequent, p_frequent), np.full(num_features - num_frequent, p_rare)]
  w = np.r_[np.zeros(num_frequent), 1.0 + 0.5 * rng.standard_normal(num_features - num_frequent)]
  n = num_clients * examples_per_client
  x = (rng.random((n, num_features)) < p).astype(np.float32)
  y = (x @ w + noise * rng.standard_normal(n)).astype(np.float32)
  counts = collections.OrderedDict(
      (f'feature_{j}', int(round(p[j] * 1e6))) for j in range(num_features))
  return SparseLinearTask(
      x=x.reshape(num_clients, examples_per_client, num_features),
      y=y.reshape(num_clients, examples_per_client, 1), true_weights=w.astype(np.float32),
      feature_counts=counts, batch_size=batch_size)
