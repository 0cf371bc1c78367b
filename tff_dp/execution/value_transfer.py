"""Values sent to a TFF worker, serialized into their request in place.

TFF 0.87's `RemoteExecutor.create_value` serializes a value with
`value_serialization.serialize_value`, which builds every struct level as a new message and
copies its elements into it three times (`Struct.Element(value=...)`, `Struct(element=...)`,
`Value(struct=...)`), every federated member once more, and then the whole value into the
request (`CreateValueRequest(value=...)`). A tensor d struct levels deep is copied about 3d + 2
times. A round's server state nests the model's weights a few levels deep and a
correlated-noise slot (`aggregators.noise_feed`, one model copy) deeper, inside the aggregator's
states, and the coordinator makes these copies before the worker can start the round
(docs/ENGINEERING_NOTES.md, "Rounds close to the compute").

Here every struct element and federated member is serialized into the message it ends up in
(`add()`), and every other value (tensors, sequences, computations) by TFF's own
`serialize_value` and copied once into place: the request is the message TFF builds, with TFF's
checks, and each tensor's bytes are copied a fixed number of times at any depth.
"""

from typing import Optional

import tensorflow_federated as tff
# pylint: disable=g-direct-tensorflow-import  (TFF's executor internals: no public API for these)
from tensorflow_federated.proto.v0 import computation_pb2
from tensorflow_federated.proto.v0 import executor_pb2
from tensorflow_federated.python.common_libs import structure
from tensorflow_federated.python.core.impl.executors import executor_base
from tensorflow_federated.python.core.impl.executors import remote_executor
from tensorflow_federated.python.core.impl.executors import value_serialization
from tensorflow_federated.python.core.impl.types import type_serialization


def serialize_into(dest: executor_pb2.Value, value, type_spec: tff.types.Type) -> tff.types.Type:
  """Writes `value` of `type_spec` into the empty message `dest`, as
  `value_serialization.serialize_value(value, type_spec)` would build it; returns the type that
  function returns (`type_spec`, or for a computation the type reconciled with it)."""
  if isinstance(type_spec, tff.StructType) and _is_plain_value(value):
    elements = structure.from_container(value)
    if len(elements) != len(type_spec):
      return _copy_of_tff(dest, value, type_spec)   # TFF's error message.
    dest.struct.SetInParent()   # An empty struct is a value too.
    for (name, element_type), (_, element) in zip(structure.iter_elements(type_spec),
                                                  structure.iter_elements(elements)):
      slot = dest.struct.element.add()
      if name:
        slot.name = name
      serialize_into(slot.value, element, element_type)
    return type_spec
  if isinstance(type_spec, tff.FederatedType) and _is_plain_value(value):
    members = [value] if type_spec.all_equal else value
    if not isinstance(members, list):
      return _copy_of_tff(dest, value, type_spec)   # TFF's error message.
    for member in members:
      member_type = serialize_into(dest.federated.value.add(), member, type_spec.member)
      type_spec.member.check_assignable_from(member_type)
    dest.federated.type.CopyFrom(type_serialization.serialize_type(type_spec).federated)
    return type_spec
  return _copy_of_tff(dest, value, type_spec)


def _is_plain_value(value) -> bool:
  """Not a computation (which `serialize_value` serializes whatever the type it is given)."""
  return not isinstance(value, (tff.framework.ConcreteComputation, computation_pb2.Computation))


def _copy_of_tff(dest: executor_pb2.Value, value, type_spec) -> tff.types.Type:
  proto, value_type = value_serialization.serialize_value(value, type_spec)
  dest.CopyFrom(proto)
  return value_type


class InPlaceValues(executor_base.Executor):
  """A TFF `RemoteExecutor` whose `create_value` builds its request in place (module
  docstring); every other call is the remote executor's own, and the values it returns are
  the remote executor's `RemoteValue`s.

  Uses the remote executor's stub and executor id (`_stub`, `_executor_id`), which TFF 0.87
  keeps private: its `create_value` is the one step replaced, and the rest of its protocol
  (cardinalities, disposal, retries of the calls) stays TFF's. A struct is sent in one request
  even if the remote executor was made with `stream_structs=True` (no context here makes one).
  """

  def __init__(self, remote: remote_executor.RemoteExecutor):
    self._remote = remote

  async def create_value(self, value, type_spec: Optional[tff.types.Type] = None):
    remote = self._remote
    if not isinstance(type_spec, (tff.StructType, tff.FederatedType)):
      return await remote.create_value(value, type_spec)
    remote._check_has_executor_id()   # pylint: disable=protected-access
    request = executor_pb2.CreateValueRequest(
        executor=remote._executor_id)   # pylint: disable=protected-access
    value_type = serialize_into(request.value, value, type_spec)
    response = remote._stub.create_value(request)   # pylint: disable=protected-access
    return remote_executor.RemoteValue(response.value_ref, value_type, remote)

  async def create_call(self, comp, arg=None):
    return await self._remote.create_call(comp, arg)

  async def create_struct(self, elements):
    return await self._remote.create_struct(elements)

  async def create_selection(self, source, index):
    return await self._remote.create_selection(source, index)

  def close(self):
    self._remote.close()


class InPlaceValueFactory(tff.framework.ExecutorFactory):
  """Executor factory: `inner`'s executors (TFF `RemoteExecutor`s) as `InPlaceValues`."""

  def __init__(self, inner: tff.framework.ExecutorFactory):
    self._inner = inner

  def create_executor(self, cardinalities):
    return InPlaceValues(self._inner.create_executor(cardinalities))

  def clean_up_executor(self, cardinalities):
    self._inner.clean_up_executor(cardinalities)
