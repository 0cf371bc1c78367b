"""AdaDPS in an experiment: a side-information source name + a task (Contract 3) -> scales,
client optimizer, server aggregator. Composition-root glue (it knows the task contract, the
optimizer names and the aggregators), so it lives in `training/`, above `adadps/`, which stays a
library of side information, preconditioners and the preconditioned optimizer."""

from typing import Optional, Sequence

import numpy as np
import tensorflow_federated as tff

from tff_dp import choices
from tff_dp.adadps import optimizer as optimizer_lib
from tff_dp.adadps import preconditioner as precond_lib
from tff_dp.adadps import side_information as si
from tff_dp.aggregators import preconditioned
from tff_dp.errors import UserInputError
from tff_dp.training.builders import optimizers

SIDE_INFO_CHOICES = tuple(choices.SIDE_INFO)


def side_info_for_task(task, side_info: str, *, public_client_ids: Sequence[str] = (),
                       initial_weights: Optional[Sequence[np.ndarray]] = None,
                       max_batches_per_client: Optional[int] = None,
                       file_kind: str = si.SCALES) -> si.SideInformation:
  """Parses `side_info` (a SIDE_INFO_CHOICES entry) and builds the side information for `task`."""
  keras_model = task.keras_model_fn()
  shapes = si.weight_shapes_of(keras_model)
  if side_info in choices.TOKEN_SIDE_INFO:
    attr, axis = ('word_counts', 0) if side_info == 'word_freq' else ('tag_counts', 1)
    counts = getattr(task, attr, None)
    if not counts:
      raise UserInputError(f'side_info={side_info} needs a task with public {attr} '
                           f'(StackOverflow); task {getattr(task, "name", task)!r} has none')
    try:
      return si.token_frequency_side_info(counts, shapes, axis=axis)
    except UserInputError as e:
      raise UserInputError(
          f'side_info={side_info} needs a model with one 2-D [words, tags] kernel (the '
          f'stackoverflow_tag logistic regression); use public_clients or file:PATH ({e})') from e
  if side_info == 'public_clients':
    if not public_client_ids:
      raise UserInputError('side_info=public_clients needs at least one public client id')
    if initial_weights is not None:
      keras_model.set_weights(list(initial_weights))
    datasets = (task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))
                for cid in public_client_ids)
    return si.public_second_moment_side_info(
        keras_model, task.loss_fn(), datasets, max_batches_per_client=max_batches_per_client)
  if side_info.startswith('file:'):
    return si.load_side_info_file(side_info[len('file:'):], shapes, kind=file_kind)
  raise UserInputError(f'side_info must be one of {", ".join(SIDE_INFO_CHOICES)}, '
                       f'got {side_info!r}')


def scales_for_task(task, side_info: str, *, public_client_ids: Sequence[str] = (),
                    cap: float = 1000.0, division: float = 1.0, eps: float = 1e-8,
                    preconditioner: str = 'auto', num_frequent: int = 100,
                    rare_scale: float = 200.0, **side_info_kwargs) -> list[np.ndarray]:
  """`side_info` + preconditioner hyperparameters -> per-weight scales for `task`."""
  info = side_info_for_task(task, side_info, public_client_ids=public_client_ids,
                            **side_info_kwargs)
  return precond_lib.build_scales(info, preconditioner=preconditioner, cap=cap,
                                  division=division, eps=eps, num_frequent=num_frequent,
                                  rare_scale=rare_scale)


def client_optimizer(name: str, learning_rate: float, scales: Sequence[np.ndarray]):
  """The client optimizer `name` with AdaDPS preconditioned gradients (client-side AdaDPS)."""
  return optimizer_lib.build_preconditioned(
      optimizers.build_optimizer(name, learning_rate), scales)


def server_aggregator(scales: Sequence[np.ndarray],
                      aggregator: Optional[tff.aggregators.UnweightedAggregationFactory],
                      unscale: bool = False):
  """Wraps the DP aggregator (None = TFF's unweighted mean) with server-side AdaDPS scaling."""
  return preconditioned.PreconditionedFactory(scales, aggregator, unscale=unscale)
