"""Client work spread across TFF worker processes on other hosts, on TFF's own runtime.

`install_worker_context(["hostA:8000", "hostB:8000"])` makes every TFF computation run on those
`worker_binary` processes (start one per host with `python -m tff_dp.worker --port 8000`):

- per worker, the async execution context TFF's own local C++ context is made of: a
  `tff.framework.RemoteExecutor` over a `tff.framework.RemoteExecutorGrpcStub` (its values
  serialized in place, `value_transfer`), compiled with
  `tff.backends.native.desugar_and_transform_to_native`;
- over all of them, `tff.backends.native.create_mergeable_comp_execution_context`: TFF compiles
  each computation to MergeableCompForm, runs `up_to_merge` on every worker with a contiguous
  slice of the round's clients, combines the partial aggregates with the aggregations' own
  `merge`, and runs `after_merge` (server update, DP noise, clip update) once;
- each worker's async context driven on its own event-loop thread (TFF's `AsyncThreadRunner`),
  so the workers' slices of a round run at the same time (see `_ThreadedWorkerContext`).

A FedAvg round with our DP aggregators has one logical aggregation (the noised sum, the
clipped-count sum and the metric sums are parallel), which is what the mergeable form needs;
the DP state (adaptive clip) is carried on the coordinator like any server state. TFF 0.87 has no
C++ composing or multi-channel remote stack; see docs/ENGINEERING_NOTES.md.

Faults: TFF retries a worker's UNAVAILABLE error forever and sets no gRPC deadline, so a dead
worker would hang the round. Our stub gives up after `unavailable_timeout` seconds of
unavailability with `WorkerUnavailableError`, and a per-call deadline (`rpc_timeout`) bounds a
hung worker; the training loop turns either into one clear error with nothing of the round
written, and `--resume` continues once the worker is back.
"""

import collections
import time
from typing import Optional, Sequence

import grpc
import tensorflow_federated as tff
from tensorflow_federated.python.common_libs import async_utils

from tff_dp.execution import contexts
from tff_dp.execution import executor_cache
from tff_dp.execution.worker_addresses import parse_workers  # noqa: F401  (re-exported)
from tff_dp.errors import UserInputError

# TFF's own channel options for its local worker (executor_factory.py), plus a short reconnect
# backoff so a restarted worker is picked up in about a second instead of up to two minutes.
_CHANNEL_OPTIONS = [
    ('grpc.max_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.max_receive_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.max_send_message_length', 2 * 1000 * 1000 * 1000),
    ('grpc.initial_reconnect_backoff_ms', 200),
    ('grpc.min_reconnect_backoff_ms', 200),
    ('grpc.max_reconnect_backoff_ms', 1000),
]


class WorkerUnavailableError(RuntimeError):
  """A worker stayed unreachable for longer than the allowed time (not retried by TFF)."""


class _CallDetails(
    collections.namedtuple('_CallDetails', ('method', 'timeout', 'metadata', 'credentials',
                                            'wait_for_ready', 'compression')),
    grpc.ClientCallDetails):
  pass


class _DeadlineInterceptor(grpc.UnaryUnaryClientInterceptor):
  """Gives every call a deadline (TFF's stub sets none): a hung worker then fails the round."""

  def __init__(self, seconds: float):
    self._seconds = seconds

  def intercept_unary_unary(self, continuation, details, request):
    return continuation(_CallDetails(details.method, self._seconds, details.metadata,
                                     details.credentials, details.wait_for_ready,
                                     details.compression), request)


class _FailFastStub(tff.framework.RemoteExecutorGrpcStub):
  """TFF's stub, but unavailability longer than `unavailable_timeout` s is a hard error."""

  def __init__(self, channel, address: str, unavailable_timeout: float):
    super().__init__(channel)
    self._address = address
    self._timeout = unavailable_timeout
    self._unavailable_since: Optional[float] = None

  def _call(self, method, request):
    try:
      result = getattr(super(), method)(request)
    except tff.framework.RetryableError as e:
      now = time.monotonic()
      if self._unavailable_since is None:
        self._unavailable_since = now
      if now - self._unavailable_since > self._timeout:
        raise WorkerUnavailableError(
            f'worker {self._address} unreachable for {now - self._unavailable_since:.0f}s '
            f'({" ".join(str(e).split())[:160]})') from e
      raise
    self._unavailable_since = None
    return result

  def get_executor(self, request):
    return self._call('get_executor', request)

  def create_value(self, request):
    return self._call('create_value', request)

  def create_call(self, request):
    return self._call('create_call', request)

  def create_struct(self, request):
    return self._call('create_struct', request)

  def create_selection(self, request):
    return self._call('create_selection', request)

  def compute(self, request):
    return self._call('compute', request)

  def dispose(self, request):
    return self._call('dispose', request)

  def dispose_executor(self, request):
    return self._call('dispose_executor', request)


class _ThreadedWorkerContext(tff.framework.AsyncContext):
  """One worker's `AsyncExecutionContext`, run on an event loop of its own (its own thread).

  Why: TFF 0.87's `RemoteExecutor` calls its gRPC stub synchronously inside its coroutines
  (`self._stub.create_call(request)`, no await; "TODO: b/134543154 - Switch to using an
  asynchronous gRPC client"). A coroutine that never suspends runs to completion once started,
  so when the mergeable context starts every worker's `up_to_merge` as a task on its single
  event loop (`_run_in_async_context_pool`), worker 1's task holds that loop from its first
  request to the end of its blocking calls (the worker_binary trains the slice's clients inside
  `CreateCall`), and worker 2's task starts only afterwards: the slices ran one after the
  other. Handing each worker's `invoke` to that worker's own loop
  thread (TFF's `AsyncThreadRunner.await_coro_and_return_result`) leaves the mergeable
  context's loop free to start the other workers; a blocking gRPC call releases the GIL while
  it waits, so all workers compute at once. Everything else is TFF's: the remote stack, its
  retries, the merge. Calls to one worker stay on its one thread, so its stub, executor cache
  and `_FailFastStub` state are never used from two threads at once (TFF's weakref finalizers
  may still dispose values from whichever thread collects them, as before).
  """

  def __init__(self, context: tff.framework.AsyncExecutionContext):
    self._context = context
    self._runner = async_utils.AsyncThreadRunner()

  @property
  def executor_factory(self):
    return self._context.executor_factory

  async def invoke(self, comp, arg):
    return await self._runner.await_coro_and_return_result(self._context.invoke(comp, arg))


def _worker_context(address: str, unavailable_timeout: float, rpc_timeout: Optional[float],
                    connect_timeout: float, interceptors: Sequence = ()):
  channel = grpc.insecure_channel(address, _CHANNEL_OPTIONS)
  if interceptors:
    channel = grpc.intercept_channel(channel, *interceptors)
  if rpc_timeout:
    channel = grpc.intercept_channel(channel, _DeadlineInterceptor(rpc_timeout))
  stub = _FailFastStub(channel, address, unavailable_timeout)
  deadline = time.monotonic() + connect_timeout
  while not stub.is_ready:
    if time.monotonic() > deadline:
      raise UserInputError(
          f'no TFF worker answers at {address}; start one there with '
          f'`python -m tff_dp.worker --port {address.rpartition(":")[2]}`')
    time.sleep(0.1)

  def stack_fn(cardinalities):
    cardinalities.setdefault(tff.CLIENTS, 0)  # Inferred from the client list, as TFF does.
    executor = tff.framework.RemoteExecutor(stub)
    executor.set_cardinalities(cardinalities)
    return executor

  # Bounded: TFF's factory would leave an executor per client count on the worker for good
  # (see tff_dp.execution.executor_cache); a worker's slice of a Poisson round varies every round.
  return _ThreadedWorkerContext(contexts.native_context(
      tff.framework.AsyncExecutionContext,
      executor_cache.BoundedExecutorFactory(
          tff.framework.ResourceManagingExecutorFactory(stack_fn))))


def install_worker_context(addresses: Sequence[str], *, unavailable_timeout: float = 60.0,
                           rpc_timeout: Optional[float] = None,
                           connect_timeout: float = 30.0,
                           interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] = ()):
  """Makes TFF run every computation on the workers at `addresses`; returns the context.

  `interceptors`: extra gRPC client interceptors on every worker channel (e.g. counting the
  bytes sent, benchmarks/bench_client_bytes.py).
  """
  if unavailable_timeout <= 0 or (rpc_timeout is not None and rpc_timeout <= 0):
    raise UserInputError('`worker_unavailable_timeout` and `worker_rpc_timeout` must be > 0')
  connect_timeout = min(connect_timeout, unavailable_timeout)
  worker_contexts = [_worker_context(a, unavailable_timeout, rpc_timeout, connect_timeout,
                                     interceptors) for a in addresses]
  context = tff.backends.native.create_mergeable_comp_execution_context(worker_contexts)
  tff.framework.set_default_context(context)
  return context
