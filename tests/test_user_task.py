"""`tff_dp.run` trains a user's own task (issue 26.4): a task defined here, in the test, not in
`tasks/`, implementing `tff_dp.training.task_protocol`. Oracles: dp_accounting built here for
the epsilon, the run directory's files for what was recorded."""

import dataclasses
import importlib
import json
import os
import re

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_dp
from tff_dp import sections
from tff_dp.errors import UserInputError
from tff_dp.training import config
from tff_dp.training import task_registry

CLIENTS, PER_ROUND, ROUNDS, Z, DELTA = 12, 4, 2, 1.0, 1e-3


class TwoClassTask:
  """Logistic regression on 4 features, 12 clients of 8 examples each, in batches of
  `batch`."""
  name = 'two_class_test'

  def __init__(self, batch: int = 4):
    self.batch = batch
    rng = np.random.default_rng(0)
    data = {f'user{i}': {'x': rng.normal(size=(8, 4)).astype(np.float32),
                         'y': rng.integers(0, 2, size=(8,)).astype(np.int32)}
            for i in range(CLIENTS)}
    self.train_data = tff.simulation.datasets.TestClientData(data)
    self.test_data = tff.simulation.datasets.TestClientData(data)

  def preprocess_train(self, dataset):
    return dataset.map(lambda e: (e['x'], e['y'])).batch(self.batch)

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


# The task recipe of docs/ARCHITECTURE.md, walked with a toy: a task registered here, with a
# setting of its own, and no file of the package touched.
TOY_TASK = 'two_class_registered'


@dataclasses.dataclass(frozen=True, kw_only=True)
class TwoClassSettings(sections.Section):
  """The toy task's own setting."""
  SECTION = 'two_class_options'
  FOLLOWS = 'task'
  two_class_batch: int = sections.setting(4, f'{TOY_TASK}: examples per batch.',
                                          check=sections.at_least(1))


@pytest.fixture
def registered_task(monkeypatch):
  """TOY_TASK registered as the recipe says (the registries restored afterwards); yields the
  builder's calls."""
  monkeypatch.setattr(sections, '_PLUG_INS', sections.plug_ins())
  monkeypatch.setattr(task_registry, '_TASKS', dict(task_registry._TASKS))  # pylint: disable=protected-access
  calls = []

  def build(data_dir, **kwargs):
    calls.append(dict(kwargs, data_dir=data_dir))
    task = TwoClassTask(batch=kwargs['batch'])
    task.name = TOY_TASK
    return task

  sections.register(TwoClassSettings)
  task_registry.register(TOY_TASK, task_registry.RegisteredTask(
      help='two classes, logistic regression (a test\'s task)', build=build,
      options={'batch': 'two_class_batch'}))
  yield calls


def test_a_task_registered_here_is_a_choice_and_its_setting_a_flag(registered_task):
  from tff_dp.training import config_flags  # pylint: disable=g-import-not-at-top
  flags = config_flags.new_flag_values()
  assert TOY_TASK in flags['task'].parser.enum_values
  assert flags['two_class_batch'].default == 4
  cfg = config.ExperimentConfig.from_settings(task=TOY_TASK, two_class_batch=2, dp='none')
  assert cfg.task_options() == {'batch': 2}
  assert cfg.settings()['two_class_batch'] == 2
  with pytest.raises(UserInputError, match='two_class_batch'):
    config.ExperimentConfig.from_settings(task=TOY_TASK, two_class_batch=0, dp='none')


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_task_registered_here_trains_by_name_with_its_setting(registered_task, tmp_path):
  cfg = _config(tmp_path / 'runs').replace(task=TOY_TASK, two_class_batch=2)
  summary = tff_dp.run(cfg)
  assert summary.rounds_completed == ROUNDS
  assert [call['batch'] for call in registered_task] == [2]
  with open(os.path.join(summary.run_dir, 'config.json')) as f:
    recorded = json.load(f)
  assert (recorded['task'], recorded['two_class_batch']) == (TOY_TASK, 2)


def _documented_task_files() -> dict[str, str]:
  with open(os.path.join(os.path.dirname(__file__), '..', 'docs', 'ARCHITECTURE.md')) as f:
    block = re.search(r'```task-files\n(.*?)```', f.read(), re.S).group(1)
  return dict(line.split(None, 1) for line in block.strip().splitlines())


def test_the_documented_files_of_a_task_are_what_each_task_takes():
  """The recipe names every field of `TaskSpec`, and each repository task's builder is a
  function of its module (TaskSpec.module / builder) whose options are TaskSettings fields."""
  import tasks  # pylint: disable=g-import-not-at-top
  files = _documented_task_files()
  assert list(files) == ['tasks/<module>.py', 'tasks/registry.py', 'tasks/synthetic_data.py',
                         'docs/FLAGS.md']
  declared = re.search(r'TaskSpec\((.*?)\)', files['tasks/registry.py']).group(1)
  assert declared.split(', ') == [f.name for f in dataclasses.fields(tasks.registry.TaskSpec)]
  setting_names = {f.name for f in dataclasses.fields(tasks.TaskSettings)}
  for spec in tasks.TASKS.values():
    assert callable(getattr(importlib.import_module(f'tasks.{spec.module}'), spec.builder))
    assert set(spec.options.values()) <= setting_names
