"""Values sent to the TFF worker are serialized in place (`execution.value_transfer`): the
request holds exactly the message TFF's own serializer builds, and rounds run through it."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.core.impl.executors import value_serialization

from tff_dp.execution import contexts
from tff_dp.execution import executor_cache
from tff_dp.execution import runtime
from tff_dp.execution import value_transfer

Slot = collections.namedtuple('Slot', ['clip', 'noise'])
_MATRIX = tff.TensorType(np.float32, (2, 3))
# A server state shaped like a round's: the model's weights, a noise slot a few levels down
# (a named tuple, as `noise_feed.FedNoise`), scalars, a string and an empty struct.
_STATE_TYPE = tff.types.to_type(collections.OrderedDict(
    model=[_MATRIX, tff.TensorType(np.float32, (3,))],
    aggregator=collections.OrderedDict(
        inner=tff.StructWithPythonType([('clip', np.float32), ('noise', [_MATRIX])], Slot),
        empty=tff.StructType([])),
    step=np.int64, name=np.str_))
_STATE = collections.OrderedDict(
    model=[np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, np.float32)],
    aggregator=collections.OrderedDict(
        inner=Slot(clip=np.float32(0.5), noise=[np.full((2, 3), 2.0, np.float32)]),
        empty=()),
    step=np.int64(7), name='run')


@tff.tensorflow.computation(_MATRIX)
def _double(x):
  return x * 2


_CASES = {
    'server state': (_STATE, tff.FederatedType(_STATE_TYPE, tff.SERVER)),
    'client values': ([np.float32(1), np.float32(2)], tff.FederatedType(np.float32, tff.CLIENTS)),
    'no clients': ([], tff.FederatedType(np.float32, tff.CLIENTS)),
    'unnamed and named elements': ([np.int32(3), np.zeros(2, np.float32)],
                                   tff.StructType([(None, np.int32),
                                                   ('b', tff.TensorType(np.float32, (2,)))])),
    'empty struct': ((), tff.StructType([])),
    'empty struct at the server': ((), tff.FederatedType(tff.StructType([]), tff.SERVER)),
    'client datasets': ([tf.data.Dataset.range(3), tf.data.Dataset.range(5)],
                        tff.FederatedType(tff.SequenceType(np.int64), tff.CLIENTS)),
    'computation': (_double, _double.type_signature),
}


@pytest.mark.parametrize('case', sorted(_CASES))
def test_a_value_is_serialized_into_its_request_as_tff_serializes_it(case):
  value, type_spec = _CASES[case]
  expected, expected_type = value_serialization.serialize_value(value, type_spec)
  request = executor_pb2.CreateValueRequest()
  returned_type = value_transfer.serialize_into(request.value, value, type_spec)
  assert returned_type == expected_type
  assert request.value.WhichOneof('value') == expected.WhichOneof('value')
  if case == 'client datasets':   # TFF names a dataset's graph nodes anew at every call.
    assert _elements(request.value) == _elements(expected) == [[0, 1, 2], [0, 1, 2, 3, 4]]
  else:
    assert request.value.SerializeToString(deterministic=True) == (
        expected.SerializeToString(deterministic=True))


def _elements(datasets_proto):
  datasets, _ = value_serialization.deserialize_value(datasets_proto)
  return [list(ds.as_numpy_iterator()) for ds in datasets]


def test_a_value_tff_refuses_is_refused_with_tff_error():
  type_spec = tff.StructType([('a', np.float32), ('b', np.float32)])
  with pytest.raises(TypeError) as tff_error:
    value_serialization.serialize_value([np.float32(1)], type_spec)
  with pytest.raises(TypeError) as ours:
    value_transfer.serialize_into(executor_pb2.Value(), [np.float32(1)], type_spec)
  assert str(ours.value) == str(tff_error.value)


def test_rounds_run_on_the_worker_with_their_values_sent_in_place(monkeypatch):
  runtime.configure_execution_context()
  sent = []

  def spy(dest, value, type_spec):
    sent.append(type_spec)
    return serialize_into(dest, value, type_spec)

  serialize_into = value_transfer.serialize_into
  monkeypatch.setattr(value_transfer, 'serialize_into', spy)

  @tff.federated_computation(tff.FederatedType(_STATE_TYPE, tff.SERVER),
                             tff.FederatedType(_MATRIX, tff.CLIENTS))
  def step(state, client_values):
    noise = tff.federated_map(_double, state.aggregator.inner.noise[0])
    return noise, tff.federated_sum(client_values)

  clients = [np.full((2, 3), float(i), np.float32) for i in range(1, 4)]
  noise, total = step(_STATE, clients)
  np.testing.assert_array_equal(noise, np.full((2, 3), 4.0, np.float32))
  np.testing.assert_array_equal(total, np.full((2, 3), 6.0, np.float32))
  assert any(isinstance(t, tff.FederatedType) and t.placement is tff.SERVER
             and t.member.is_equivalent_to(_STATE_TYPE) for t in sent)   # The state, in place.


def test_a_context_is_built_only_over_a_bounded_executor_factory():
  """TFF's own factory would keep an executor per client count on the worker for good."""
  with pytest.raises(TypeError, match='BoundedExecutorFactory'):
    contexts.native_context(tff.framework.SyncExecutionContext,
                            tff.framework.local_cpp_executor_factory())
  context = contexts.native_context(
      tff.framework.SyncExecutionContext,
      executor_cache.BoundedExecutorFactory(tff.framework.local_cpp_executor_factory()))
  assert isinstance(context, tff.framework.SyncExecutionContext)
