"""Our FedAvg builder is TFF's build_(un)weighted_fed_avg minus the per-client initializers."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.training.builders import fed_avg


@pytest.fixture
def task(tiny_tag_task):
  return tiny_tag_task


def _client_graph(process) -> bytes:
  return process.next.to_building_block().proto.SerializeToString()


@pytest.mark.parametrize('uniform', [True, False])
def test_same_process_as_tff_without_client_initializers(task, uniform):
  data = [task.preprocess_train(task.train_data.create_tf_dataset_for_client(c))
          for c in task.train_data.client_ids[:4]]
  kwargs = dict(client_optimizer_fn=tff.learning.optimizers.build_sgdm(0.5),
                server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
                loop_implementation=tff.learning.LoopImplementation.DATASET_ITERATOR)
  builder = (tff.learning.algorithms.build_unweighted_fed_avg if uniform
             else tff.learning.algorithms.build_weighted_fed_avg)
  tf.keras.utils.set_random_seed(0)
  theirs = builder(task.model_fn, **kwargs)
  tf.keras.utils.set_random_seed(0)
  ours = fed_avg.build_fed_avg(
      task.model_fn, client_optimizer=kwargs['client_optimizer_fn'],
      server_optimizer=kwargs['server_optimizer_fn'], uniform=uniform,
      loop_implementation=kwargs['loop_implementation'])
  assert ours.next.type_signature == theirs.next.type_signature   # Same state and metrics.
  # TFF's client work draws the Dense kernel's glorot values for every client; ours does not.
  assert b'RandomUniform' in _client_graph(theirs)
  assert b'RandomUniform' not in _client_graph(ours)
  states = [theirs.initialize(), ours.initialize()]
  tf.nest.map_structure(np.testing.assert_array_equal, *states)   # Real initial model.
  outputs = [p.next(s, data) for p, s in zip((theirs, ours), states)]
  for a, b in zip(*(tf.nest.flatten(o.state.global_model_weights) for o in outputs)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  assert not np.array_equal(tf.nest.flatten(states[0].global_model_weights)[0],
                            tf.nest.flatten(outputs[0].state.global_model_weights)[0])
  train = [o.metrics['client_work']['train'] for o in outputs]
  np.testing.assert_allclose(train[0]['loss'], train[1]['loss'], rtol=1e-6)
