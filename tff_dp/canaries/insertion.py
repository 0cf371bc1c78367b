"""Canary clients inside a TFF learning process (Andrew et al., ICLR 2024, Sec. 4).

A canary client is sampled like any client and its update goes through the same aggregator
(clip, noise, ledger) as a real client's; only what it sends differs: a large multiple of its
secret direction c_k (`directions.py`), so every configured clip cuts it to exactly the clip
norm along c_k, the worst case the accountant assumes.

How the process tells canaries apart: `build_canary_client_work` wraps TFF's client work so
that each client's data is a pair of sequences, `data` (the real dataset; empty for a canary)
and `canary` (one int64 [4] element: the canary's shift, the two base seeds and the base's
length D, or `REAL`).
A struct of sequences is what TFF's `ClientWorkProcess` allows as client data, and the base
seed travels with the data rather than inside the traced computation, so the secret is in no
graph. The client trains on its data as usual (nothing, for a canary), then its update is
replaced by the canary's when the marker says so: the canary's vector is drawn where the client
runs, from the seed (`tf.random.stateless_normal`, the same draw `tf_base_vector` makes on the
coordinator), so only 32 bytes per client cross to the workers.

Why not a wrapper around the aggregator: a TFF aggregator sees client values only, with no way
to tell which client sent one; the client work is where a client's identity (its data) is.
"""

import collections

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.canaries import directions as directions_lib

# A canary update's norm before clipping: far above any clip a run configures or adapts to, so
# every clip (flat, per group: a group holding a fraction f of the weights gets ~1e6 sqrt(f))
# cuts it to the clip norm. Finite in float32 with room to square it (1e12 << 3.4e38).
CANARY_NORM = 1e6
# The `canary` element of a real client.
REAL = np.array([-1, 0, 0, 0], dtype=np.int64)


def tf_base_vector(seed: tuple[int, int], length: int) -> np.ndarray:
  """The base vector g the clients draw (`CanaryDirections(base_fn=...)`): float32 stateless
  normals from `seed`, as float64."""
  return tf.random.stateless_normal([length], seed=tf.constant(seed, tf.int64),
                                    dtype=tf.float32).numpy().astype(np.float64)


def marker(shift: int, base_seed: tuple[int, int], length: int) -> np.ndarray:
  """The `canary` element of the canary with this shift (of a base of this length)."""
  return np.array([shift, base_seed[0], base_seed[1], length], dtype=np.int64)


def markers(directions) -> list[np.ndarray]:
  """The `canary` elements of `directions`' inserted canaries, by index."""
  seed = directions.base_seed()
  return [marker(int(s), seed, directions.length)
          for s in directions.shifts(directions_lib.INSERTED)]


def client_value(data, canary_marker: np.ndarray) -> collections.OrderedDict:
  """What the wrapped process takes for one client: its dataset and its canary marker (`REAL`
  for a real client)."""
  return collections.OrderedDict(
      data=data, canary=tf.data.Dataset.from_tensors(tf.constant(canary_marker, tf.int64)))


def build_canary_client_work(
    client_work: tff.learning.templates.ClientWorkProcess,
    canary_norm: float = CANARY_NORM) -> tff.learning.templates.ClientWorkProcess:
  """`client_work` whose clients take `client_value(dataset, marker)` and send the canary's
  update (norm `canary_norm`) when the marker names a canary; otherwise unchanged (state,
  measurements, weights and real clients' updates are `client_work`'s)."""
  state_type, weights_type, data_type = client_work.next.type_signature.parameter
  result_type = client_work.next.type_signature.result.result.member
  canary_type = tff.SequenceType(tff.TensorType(np.int64, [4]))
  pair_type = tff.StructWithPythonType(
      [('data', data_type.member), ('canary', canary_type)], collections.OrderedDict)

  @tff.tensorflow.computation(result_type, canary_type)
  def insert(result, canary):
    info = canary.reduce(tf.constant(REAL), lambda _, element: element)
    updates = tf.nest.flatten(result.update)
    sizes = [int(np.prod(u.shape.as_list())) for u in updates]

    def canary_update():
      base = tf.random.stateless_normal(info[3:], seed=info[1:3], dtype=tf.float32)
      window = tf.roll(base, shift=info[0], axis=0)[:sum(sizes)]
      vector = window * (canary_norm / tf.norm(window))
      return [tf.reshape(piece, u.shape)
              for piece, u in zip(tf.split(vector, sizes), updates)]

    chosen = tf.cond(info[0] >= 0, canary_update, lambda: updates)
    return tff.learning.templates.ClientResult(
        update=tf.nest.pack_sequence_as(result.update, chosen),
        update_weight=result.update_weight)

  @tff.federated_computation(state_type, weights_type,
                             tff.FederatedType(pair_type, tff.CLIENTS))
  def next_fn(state, weights, client_data):
    output = client_work.next(state, weights, client_data.data)
    result = tff.federated_map(insert, (output.result, client_data.canary))
    return tff.templates.MeasuredProcessOutput(output.state, result, output.measurements)

  return tff.learning.templates.ClientWorkProcess(
      client_work.initialize, next_fn, get_hparams_fn=client_work.get_hparams,
      set_hparams_fn=client_work.set_hparams)
