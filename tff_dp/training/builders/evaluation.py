"""Centralized evaluation of server models (last iterate and checkpoint aggregates).

Evaluating with a compiled Keras model on the pooled test data is much faster in simulation than
a federated evaluation computation, and gives the same numbers (example-weighted means).
"""

from typing import Callable, Sequence

import numpy as np
import tensorflow as tf


class CentralizedEvaluator:
  """Evaluates flat weight lists (trainable then non-trainable) on a fixed eval dataset."""

  def __init__(self, keras_model_fn: Callable[[], tf.keras.Model], loss_fn, metrics_fn,
               eval_dataset: tf.data.Dataset, compiled: bool = True):
    self._model = keras_model_fn()
    # A plain loop instead of compile()/evaluate(): no Keras training-loop machinery (and no
    # retracing) per evaluation, and the same example-weighted means.
    self._loss_fn = loss_fn()
    self._metrics = metrics_fn()
    self._dataset = eval_dataset.cache()
    # The whole pass over the data as one graph (`compiled`, traced at the first evaluation):
    # no Python between batches (benchmarks/bench_evaluation.py measures it against
    # `compiled=False`, the same pass run eagerly).
    self._pass = tf.function(self._all_batches) if compiled else self._all_batches

  @property
  def output_dim(self) -> int:
    """Size of the model's last output axis (number of classes / vocabulary)."""
    return int(self._model.output_shape[-1])

  @property
  def trainable_shapes(self) -> list[tuple]:
    """Shapes of the model's trainable weights, in the order of the flat model weights."""
    return [tuple(v.shape) for v in self._model.trainable_variables]

  @property
  def trainable_weight_names(self) -> list[str]:
    """Names of the model's trainable weights, in the order of the flat model weights."""
    return [v.name.split(':')[0] for v in self._model.trainable_variables]

  def _assign(self, flat_weights: Sequence[np.ndarray]) -> None:
    variables = list(self._model.trainable_weights) + list(self._model.non_trainable_weights)
    if len(variables) != len(flat_weights):
      raise ValueError(f'expected {len(variables)} weight arrays, got {len(flat_weights)}')
    for var, value in zip(variables, flat_weights):
      var.assign(value)

  def evaluate(self, flat_weights: Sequence[np.ndarray]) -> dict[str, float]:
    self._assign(flat_weights)
    for metric in self._metrics:
      metric.reset_state()
    loss_sum, num_examples = self._pass()
    results = {'loss': float(loss_sum) / max(int(num_examples), 1)}
    results.update({m.name: float(m.result()) for m in self._metrics})
    return results

  def _all_batches(self):
    """(the example-weighted sum of the batches' mean losses, the number of examples), as
    Keras' evaluate weighs them, with the metrics updated batch by batch."""
    loss_sum = tf.constant(0.0, tf.float64)
    num_examples = tf.constant(0, tf.int64)
    for x, y in self._dataset:
      predictions = self._model(x, training=False)
      for metric in self._metrics:
        metric.update_state(y, predictions)
      batch = tf.shape(y, out_type=tf.int64)[0]
      loss_sum += tf.cast(self._loss_fn(y, predictions), tf.float64) * tf.cast(batch,
                                                                               tf.float64)
      num_examples += batch
    return loss_sum, num_examples

  def save_model(self, flat_weights: Sequence[np.ndarray], path: str) -> None:
    """Writes the model with these weights in Keras' own format (`path` ends in .keras):
    architecture and weights, loadable with `tf.keras.models.load_model` without this
    package."""
    self._assign(flat_weights)
    self._model.save(path)

  def predict_scores(self, flat_weights: Sequence[np.ndarray], max_examples: int = 1000):
    """Per-example predicted scores, flattened per example (for last-k uncertainty)."""
    self._assign(flat_weights)
    outs, n = [], 0
    for x, _ in self._dataset:
      outs.append(self._model(x, training=False).numpy().reshape(x.shape[0], -1))
      n += outs[-1].shape[0]
      if n >= max_examples:
        break
    return np.concatenate(outs)[:max_examples]


def flat_model_weights(model_weights) -> list[np.ndarray]:
  """`tff.learning.models.ModelWeights` -> flat list of numpy arrays (trainable first)."""
  return [np.asarray(w) for w in list(model_weights.trainable) + list(model_weights.non_trainable)]
