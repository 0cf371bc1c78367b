"""FedAvg as `tff.learning.algorithms.build_(un)weighted_fed_avg` composes it, with the client's
model built without running its initializers.

TFF's FedAvg client work builds the model (`model_fn`) inside the client computation, so every
client of every round creates the model's variables and runs their initializers, only to
overwrite them at once with the broadcast server weights. For the StackOverflow LSTM that is an
orthogonal initializer (a QR decomposition of a 670 x 2680 matrix) plus ~2M random draws per
client: rounds of clients with no data measured 0.22 CPU s per client with TFF's client work
against 0.04 s here, about a quarter of what a client with 40 examples costs in all
(`benchmarks/bench_limit.py` shows it whole: ours against `tff_iterator`). Here the client
work's model_fn creates its trainable variables with zeros as initial values
(`tf.variable_creator_scope`, public TF), values that are never read; the server's initial model
still comes from `model_fn` with its real initializers. Everything else is TFF's own parts, put
together as `fed_avg.py` does (broadcast, model-delta client work, aggregator, apply-optimizer
finalizer, `compose_learning_process`), so the process, its state and its results are those of
`build_(un)weighted_fed_avg`.
"""

from typing import Callable

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.canaries import insertion


def _zero_initial_values(next_creator, **kwargs):
  """Variable creator: trainable variables start as zeros instead of running the initializer."""
  initial_value, shape, dtype = (kwargs.get('initial_value'), kwargs.get('shape'),
                                 kwargs.get('dtype'))
  if (kwargs.get('trainable') is not False and callable(initial_value) and dtype is not None
      and shape is not None and tf.TensorShape(shape).is_fully_defined()):
    kwargs['initial_value'] = lambda: tf.zeros(shape, dtype)
  return next_creator(**kwargs)


def client_model_fn(model_fn: Callable[[], tff.learning.models.VariableModel]):
  """`model_fn` whose trainable variables are created as zeros (for the client work only:
  it assigns the broadcast weights to every trainable variable before reading any)."""
  def build():
    with tf.variable_creator_scope(_zero_initial_values):
      return model_fn()
  return build


def build_fed_avg(model_fn: Callable[[], tff.learning.models.VariableModel], *,
                  client_optimizer: tff.learning.optimizers.Optimizer,
                  server_optimizer: tff.learning.optimizers.Optimizer,
                  model_aggregator=None, uniform: bool = True,
                  loop_implementation: tff.learning.LoopImplementation = (
                      tff.learning.LoopImplementation.DATASET_ITERATOR),
                  canaries: bool = False,
                  ) -> tff.learning.templates.LearningProcess:
  """`build_unweighted_fed_avg` (uniform) or `build_weighted_fed_avg` (by example count).

  `model_aggregator`: an unweighted factory when `uniform` (None: TFF's unweighted mean), a
  weighted one otherwise (None: TFF's weighted mean), as in TFF.
  """
  @tff.tensorflow.computation()
  def initial_model_weights_fn():
    return tff.learning.models.ModelWeights.from_model(model_fn())

  weights_type = initial_model_weights_fn.type_signature.result
  if uniform:
    aggregator = tff.aggregators.as_weighted_aggregator(
        model_aggregator or tff.aggregators.UnweightedMeanFactory())
    weighting = tff.learning.ClientWeighting.UNIFORM
  else:
    aggregator = model_aggregator or tff.aggregators.MeanFactory()
    weighting = tff.learning.ClientWeighting.NUM_EXAMPLES
  client_work = tff.learning.templates.build_model_delta_client_work(
      client_model_fn(model_fn), client_optimizer, client_weighting=weighting,
      loop_implementation=loop_implementation)
  if canaries:
    client_work = insertion.build_canary_client_work(client_work)
  return tff.learning.templates.compose_learning_process(
      initial_model_weights_fn,
      tff.learning.templates.build_broadcast_process(weights_type),
      client_work,
      aggregator.create(weights_type.trainable, tff.TensorType(np.float32)),
      tff.learning.templates.build_apply_optimizer_finalizer(server_optimizer, weights_type))
