"""`tff_dp.run` trains a user's own task (issue 26.4): a task defined here, in the test, not in
`tasks/`, implementing `tff_dp.training.task_protocol`. Oracles: dp_accounting built here for
the epsilon, the run directory's files for what was recorded."""

import json
import os

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_dp
from tff_dp.errors import UserInputError
from tff_dp.training import config

CLIENTS, PER_ROUND, ROUNDS, Z, DELTA = 12, 4, 2, 1.0, 1e-3


class TwoClassTask:
  """Logistic regression on 4 features, 12 clients of 8 examples each."""
  name = 'two_class_test'

  def __init__(self):
    rng = np.random.default_rng(0)
    data = {f'user{i}': {'x': rng.normal(size=(8, 4)).astype(np.float32),
                         'y': rng.integers(0, 2, size=(8,)).astype(np.int32)}
            for i in range(CLIENTS)}
    self.train_data = tff.simulation.datasets.TestClientData(data)
    self.test_data = tff.simulation.datasets.TestClientData(data)

  def preprocess_train(self, dataset):
    return dataset.map(lambda e: (e['x'], e['y'])).batch(4)

  preprocess_eval = preprocess_train

  def keras_model_fn(self):
    return tf.keras.Sequential([tf.keras.layers.InputLayer(input_shape=(4,)),
                                tf.keras.layers.Dense(2, activation='softmax')])

  def loss_fn(self):
    return tf.keras.losses.SparseCategoricalCrossentropy()

  def metrics_fn(self):
    return [tf.keras.metrics.SparseCategoricalAccuracy(name='accuracy')]

  def model_fn(self):
    spec = (tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32))
    return tff.learning.models.from_keras_model(
        self.keras_model_fn(), loss=self.loss_fn(), input_spec=spec, metrics=self.metrics_fn())


def _config(root):
  return tff_dp.ExperimentConfig(
      sampling=config.SamplingConfig(clients_per_round=PER_ROUND),
      training=config.TrainingConfig(total_rounds=ROUNDS),
      dp=config.DPConfig(kind='fixed', clip=1.0, noise_multiplier=Z),
      accounting=config.AccountingConfig(methods=('rdp',), delta=DELTA),
      output=config.OutputConfig(root_output_dir=str(root)))


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_task_defined_here_trains_and_is_accounted(tmp_path):
  lines = []
  summary = tff_dp.run(_config(tmp_path / 'runs'), task=TwoClassTask(), log=lines.append)
  assert summary.rounds_completed == ROUNDS
  assert os.path.basename(summary.run_dir).startswith('two_class_test-fixed-')
  with open(os.path.join(summary.run_dir, 'config.json')) as f:
    assert json.load(f)['task'] == 'two_class_test'
  direct = dp_accounting.rdp.RdpAccountant()
  direct.compose(dp_accounting.PoissonSampledDpEvent(
      PER_ROUND / CLIENTS, dp_accounting.GaussianDpEvent(Z)), ROUNDS)
  assert summary.privacy['epsilon']['rdp'] == pytest.approx(direct.get_epsilon(DELTA),
                                                             rel=1e-6)
  assert any(line.startswith(f'round    {ROUNDS}/{ROUNDS}') for line in lines), lines


def test_an_object_that_is_not_a_task_is_refused_before_anything_is_written(tmp_path):
  task = TwoClassTask()
  task.model_fn = None
  with pytest.raises(UserInputError, match='model_fn must be callable'):
    tff_dp.run(_config(tmp_path / 'runs'), task=task)
  assert not os.path.exists(tmp_path / 'runs')
