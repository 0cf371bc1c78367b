"""The learning process of an experiment, from its training, AdaDPS and runtime sections and the
DP factory: optimizers, preconditioning, non-finite zeroing, TFF's FedAvg, and optionally the
client datasets built on the workers."""

from typing import Optional

import tensorflow_federated as tff

from tff_dp import choices
from tff_dp import measurements
from tff_dp.aggregators import non_finite
from tff_dp.aggregators import reporting
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib
from tff_dp.training.builders import adadps_setup
from tff_dp.training.builders import fed_avg
from tff_dp.training.builders import optimizers

# `loop_implementation` -> TFF's client training loop. dataset_iterator: a Python `for` over
# the dataset inside the client's tf.function; dataset_reduce (TFF's default): one
# DatasetReduce op. They run the same steps in the same order (same model, to float rounding).
LOOP_IMPLEMENTATIONS = {
    'dataset_iterator': tff.learning.LoopImplementation.DATASET_ITERATOR,
    'dataset_reduce': tff.learning.LoopImplementation.DATASET_REDUCE,
}
choices.check_implemented(choices.LOOP_IMPLEMENTATIONS, LOOP_IMPLEMENTATIONS,
                          'tff_dp.training.builders.build_process loop implementations')


def build(task, training: config_lib.TrainingConfig, adadps: config_lib.AdaDPSConfig,
          runtime: config_lib.RuntimeConfig, dp_factory, *, public_ids: list,
          canaries: bool):
  """TFF's FedAvg process of `task` with `dp_factory` (None: TFF's mean) as model aggregator,
  and the measurements that aggregator declares (`tff_dp.measurements`; a process reporting an
  undeclared one is refused, RunFailedError).

  `public_ids`: AdaDPS's public clients (`side_info=public_clients`); `canaries`: clients may
  send a canary's update (fed_avg.py)."""
  client_optimizer = optimizers.build_optimizer(training.client_optimizer,
                                                training.client_learning_rate)
  server_optimizer = optimizers.build_optimizer(
      training.server_optimizer, training.server_learning_rate,
      momentum=training.server_momentum)
  aggregator = dp_factory
  if adadps.precondition != 'none':
    scales = adadps_setup.scales_for_task(
        task, adadps.side_info, public_client_ids=public_ids, cap=adadps.precondition_cap,
        division=adadps.precondition_division, eps=adadps.precondition_eps,
        preconditioner=adadps.preconditioner, num_frequent=adadps.precondition_num_frequent,
        rare_scale=adadps.precondition_rare_scale)
    if adadps.precondition == 'client':
      client_optimizer = adadps_setup.client_optimizer(
          training.client_optimizer, training.client_learning_rate, scales)
    else:
      aggregator = adadps_setup.server_aggregator(scales, aggregator)
  uniform = training.weighting == 'uniform'
  if uniform:
    # Outermost: a NaN/Inf client update is zeroed before any clipping or preconditioning.
    aggregator = non_finite.NonFiniteZeroingFactory(
        aggregator if aggregator is not None else tff.aggregators.UnweightedMeanFactory())
  # TFF's build_unweighted_fed_avg (or, by example count, build_weighted_fed_avg with its
  # default mean), less the per-client model initializers (see fed_avg.py).
  process = fed_avg.build_fed_avg(
      task.model_fn, client_optimizer=client_optimizer, server_optimizer=server_optimizer,
      model_aggregator=aggregator if uniform else None, uniform=uniform,
      loop_implementation=LOOP_IMPLEMENTATIONS[runtime.loop_implementation],
      canaries=canaries)
  # A measurement no factory declares has no known coverage: refused before the run writes.
  model_aggregator = aggregator if uniform else None
  reporting.check_declared(model_aggregator,
                           process.next.type_signature.result.metrics.member['aggregator'])
  if runtime.datasets_on_workers:
    process = _with_datasets_on_workers(process, task)
  return process, measurements.declared(model_aggregator)


def _with_datasets_on_workers(process, task):
  """`process` whose `next` takes client ids (tf.string at CLIENTS) and builds each client's
  preprocessed dataset where the client runs, with the task's dataset computation.

  The round's DP aggregation, state and measurements are those of `process` (TFF only maps the
  dataset computation over the ids before `process.next`'s body), so ledger and accounting are
  unchanged. The loop passes only ids of clients the coordinator checked (sampled from the
  task's client ids, data read and checked once, as in the default mode).
  """
  try:
    computation = getattr(task, 'train_dataset_computation', None)
  except ValueError:   # A FederatedTask whose data cannot be read from a traced id.
    computation = None
  if computation is None:
    raise UserInputError(f'`datasets_on_workers`: task {getattr(task, "name", task)!r} has no '
                         'dataset computation of a client id (train_dataset_computation)')
  return tff.simulation.compose_dataset_computation_with_learning_process(computation, process)


def client_id_argument(client_id, dataset=None):
  """A client id as the `process.next` argument of `_with_datasets_on_workers`: UTF-8 bytes.

  TFF 0.87 serializes a Python str argument with `np.asarray(value, np.bytes_)`, which fails on
  any non-ASCII id (UnicodeEncodeError) and drops trailing NULs; bytes go through unchanged.
  """
  del dataset   # Checked by the loop; built again on the worker.
  return client_id.encode('utf-8') if isinstance(client_id, str) else client_id


def client_dataset_fn(task):
  """client id -> preprocessed training dataset; the task's faster builder when it has one."""
  if hasattr(task, 'train_dataset_for_client'):
    return task.train_dataset_for_client
  return lambda cid: task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))


def side_information(adadps: config_lib.AdaDPSConfig) -> Optional[str]:
  """What the privacy statement says of AdaDPS side information (None without AdaDPS)."""
  if adadps.precondition == 'none':
    return None
  if adadps.side_info in choices.TOKEN_SIDE_INFO:
    return (f'AdaDPS side information ({adadps.side_info}): counts over the whole dataset, the '
            'training clients\' own data included, used as public (as in the AdaDPS paper); '
            'not covered by the DP guarantee')
  if adadps.side_info == 'public_clients':
    return (f'AdaDPS side information from {adadps.num_public_clients} public clients, '
            'removed from the training population')
  return ('AdaDPS side information read from a file the operator declared public')
