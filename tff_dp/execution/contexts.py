"""The TFF execution context every run of ours computes in, local worker or remote ones.

TFF's own native contexts are built from an executor factory, its native compiler and the
TensorFlow argument and result transforms. Ours differ in the executor factory only: it keeps
a bounded number of executor stacks on the worker (`executor_cache`, whatever client counts
the sampler draws) and sends values serialized in place (`value_transfer`). `runtime` (the
local worker) and `distributed` (one context per remote worker) both build theirs here, so the
two cannot drift apart.
"""

from typing import Type

import tensorflow_federated as tff
# Not re-exported under tff.*: the argument/result transforms TFF's own native contexts use.
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation

from tff_dp.execution import executor_cache
from tff_dp.execution import value_transfer


def native_context(context_class: Type, factory: executor_cache.BoundedExecutorFactory):
  """A `context_class` (`tff.framework.SyncExecutionContext` or `AsyncExecutionContext`)
  compiling as TFF's native contexts do, over `factory`'s executors, values sent in place.

  `factory` must be bounded: TFF's own factories leave an executor per client count on the
  worker for good (`executor_cache`).
  """
  if not isinstance(factory, executor_cache.BoundedExecutorFactory):
    raise TypeError(f'factory must be an executor_cache.BoundedExecutorFactory, got '
                    f'{type(factory).__name__}')
  return context_class(
      executor_fn=value_transfer.InPlaceValueFactory(factory),
      compiler_fn=tff.backends.native.desugar_and_transform_to_native,
      transform_args=tensorflow_computation.transform_args,
      transform_result=tensorflow_computation.transform_result)
