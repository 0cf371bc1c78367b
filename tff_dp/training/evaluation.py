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
               eval_dataset: tf.data.Dataset):
    self._model = keras_model_fn()
    self._model.compile(loss=loss_fn(), metrics=metrics_fn())
    self._dataset = eval_dataset.cache()
    self._num_trainable = len(self._model.trainable_weights)

  def _assign(self, flat_weights: Sequence[np.ndarray]) -> None:
    variables = list(self._model.trainable_weights) + list(self._model.non_trainable_weights)
    if len(variables) != len(flat_weights):
      raise ValueError(f'expected {len(variables)} weight arrays, got {len(flat_weights)}')
    for var, value in zip(variables, flat_weights):
      var.assign(value)

  def evaluate(self, flat_weights: Sequence[np.ndarray]) -> dict[str, float]:
    self._assign(flat_weights)
    results = self._model.evaluate(self._dataset, verbose=0, return_dict=True)
    return {k: float(v) for k, v in results.items()}

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
