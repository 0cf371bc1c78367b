"""Client datasets built on the workers from client ids (`datasets_on_workers`): the same
elements as the coordinator-built pipeline for any id, the same model, ledger and rejections."""

import json
import os
import sqlite3

import numpy as np
import pytest
import tensorflow as tf

import tasks
from tasks import synthetic_data
from tff_dp import ledger as ledger_lib
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib
from tff_dp.training import experiment
from tff_dp.training.builders import build_process
from test_tasks import ODD_IDS
from test_tasks import _odd_emnist_cache
from test_tasks import _rows


def _elements(dataset):
  return [tf.nest.map_structure(np.asarray, e) for e in dataset]


def _assert_same_elements(got, want):
  assert len(got) == len(want) > 0
  for g, w in zip(got, want):
    tf.nest.map_structure(np.testing.assert_array_equal, g, w)


def test_dataset_computation_reads_exactly_its_rows_for_any_id(tmp_path):
  db = _odd_emnist_cache(str(tmp_path))
  tf.keras.utils.set_random_seed(7)   # As experiment.run does before building anything.
  task = tasks.build_task('emnist', str(tmp_path), client_batch_size=2, shuffle_seed=3)
  computation = task.train_dataset_computation
  assert str(computation.type_signature.parameter) == 'str'
  for cid in ODD_IDS:
    on_worker = _elements(computation(build_process.client_id_argument(cid)))
    # What the coordinator builds and serializes into the round in the default mode.
    _assert_same_elements(on_worker, _elements(task.train_dataset_for_client(cid)))
    # Against sqlite3 with bound parameters: the client's examples exactly (the seeded shuffle
    # reorders them within the client; batches of 2).
    want = _rows(db, 'all_train', cid)
    labels = np.concatenate([e[1] for e in on_worker])
    pixels = np.concatenate([e[0] for e in on_worker]).reshape(len(labels), -1)
    assert len(labels) == len(want) == ODD_IDS.index(cid) + 2, cid
    want_pairs = sorted((w['label'].int64_list.value[0],
                         tuple(np.float32(w['pixels'].float_list.value))) for w in want)
    assert sorted(zip(labels.tolist(), map(tuple, pixels))) == want_pairs, cid
  # Why not TFF's own dataset computation over TFF's SqlClientData: it pastes the id into the
  # SQL text, and this id selects every client's rows.
  raw_train, _ = tff_load_emnist(str(tmp_path))
  # pylint: disable=protected-access
  tff_sql = raw_train._underlying_client_data
  injected = len(list(tff_sql.dataset_computation("x' OR '1'='1")))
  assert injected > len(_rows(db, 'all_train', "x' OR '1'='1"))


def tff_load_emnist(path):
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  return tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=path)


@pytest.mark.parametrize('name,options', [
    ('stackoverflow_word', dict(vocab_size=300)),
    ('stackoverflow_tag', dict(word_vocab_size=300, tag_vocab_size=50))])
def test_stackoverflow_dataset_computation_is_the_coordinator_pipeline(tmp_path, name, options):
  synthetic_data.write_stackoverflow_cache(str(tmp_path), num_train_clients=3,
                                           examples_per_client=9, vocab_size=400, num_tags=60)
  tf.keras.utils.set_random_seed(1)
  task = tasks.build_task(name, str(tmp_path), client_batch_size=4, shuffle_seed=5, **options)
  for cid in task.train_data.client_ids:
    _assert_same_elements(_elements(task.train_dataset_computation(cid.encode())),
                          _elements(task.train_dataset_for_client(cid)))


_ODD_ID = "x' OR 'ë'='ë"       # Real examples (copied from another client); not ASCII.
_EMPTY_ID = "o'brien (empty)"  # Listed in client_metadata, no examples: rejected every round.


@pytest.fixture(scope='module')
def odd_so_cache(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('so'))
  synthetic_data.write_stackoverflow_cache(path, num_train_clients=6, examples_per_client=8,
                                           seed=2, vocab_size=200, num_tags=30, num_topics=5)
  db = os.path.join(path, 'stackoverflow.sqlite')
  with sqlite3.connect(db) as con:
    source = con.execute("SELECT client_id FROM client_metadata WHERE split_name='train' "
                         'ORDER BY client_id LIMIT 1').fetchone()[0]
    con.execute('INSERT INTO examples SELECT split_name, ?, serialized_example_proto FROM '
                "examples WHERE client_id=? AND split_name='train' ORDER BY rowid",
                (_ODD_ID, source))
    con.execute("INSERT INTO client_metadata VALUES (?, 'train', 8)", (_ODD_ID,))
    con.execute("INSERT INTO client_metadata VALUES (?, 'train', 0)", (_EMPTY_ID,))
  con.close()
  return path


def _run(data_dir, root, name, **overrides):
  cfg = dict(root_output_dir=str(root), experiment_name=name, task='stackoverflow_tag',
             total_rounds=2, seed=4,
             clients_per_round=6, client_sampling='fixed_size', sampling_seed=0,
             dp='adaptive', clip=0.5, noise_multiplier=0.0, clipped_count_stddev=0.0,
             max_eval_examples=50, accounting=('rdp',), client_learning_rate=1.0)
  cfg.update(overrides)
  task = tasks.build_task('stackoverflow_tag', data_dir, client_batch_size=4, shuffle_seed=4,
                          word_vocab_size=200, tag_vocab_size=30)
  assert _ODD_ID in task.train_data.client_ids and _EMPTY_ID in task.train_data.client_ids
  lines = []
  summary = experiment.run(config_lib.ExperimentConfig.from_settings(cfg), task, log=lines.append)
  records = ledger_lib.read_ledger(os.path.join(summary.run_dir, 'ledger.jsonl'))
  weights = summary.final_state.global_model_weights
  return weights, records, [l for l in lines if 'skipped' in l]


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_ids_mode_trains_the_same_model_with_the_same_ledger(odd_so_cache, tmp_path):
  # All 8 clients (6 + the two odd ones) in both rounds: the odd id trains, the empty one is
  # rejected, in both modes.
  weights_a, records_a, skipped_a = _run(odd_so_cache, tmp_path, 'datasets',
                                          clients_per_round=8)
  weights_b, records_b, skipped_b = _run(odd_so_cache, tmp_path, 'ids', clients_per_round=8,
                                          datasets_on_workers=True)
  assert len(records_a) == 2 and records_a == records_b   # Same sampling events and queries.
  assert skipped_a == skipped_b and len(skipped_a) == 2 and _EMPTY_ID in skipped_a[0]
  for a, b in zip(tf.nest.flatten(weights_a), tf.nest.flatten(weights_b)):
    np.testing.assert_array_equal(a, b)
  # Training happened (the compared weights are not just the initial model).
  weights_0, _, _ = _run(odd_so_cache, tmp_path, 'one_round', clients_per_round=8,
                         total_rounds=1, datasets_on_workers=True)
  assert any(not np.array_equal(a, b) for a, b in zip(tf.nest.flatten(weights_0),
                                                       tf.nest.flatten(weights_b)))


def test_datasets_on_workers_is_validated_and_may_change_on_resume(tmp_path):
  cfg = config_lib.ExperimentConfig.from_settings(
      root_output_dir=str(tmp_path), experiment_name='x', clip=1.0, noise_multiplier=1.0)
  assert cfg.runtime.datasets_on_workers is False
  changed = cfg.replace(datasets_on_workers=True)
  recorded = json.loads(json.dumps(cfg.settings()))   # As config.json holds it.
  assert experiment.resume_changes(recorded, changed) == {
      'datasets_on_workers': (False, True)}
  with pytest.raises(UserInputError, match='`datasets_on_workers`'):
    cfg.replace(datasets_on_workers='yes')


def test_task_without_a_dataset_computation_is_a_user_error():
  class Task:   # A duck-typed task without `train_dataset_computation`.
    name = 'plain'
  with pytest.raises(UserInputError, match='`datasets_on_workers`'):
    build_process._with_datasets_on_workers(object(), Task())  # pylint: disable=protected-access


@pytest.mark.slow
def test_cli_ids_on_a_remote_worker_match_the_local_datasets_run(tmp_path):
  """--datasets_on_workers through `--workers` (TFF's mergeable context over a loopback
  worker): the same metrics as the local run that serializes datasets."""
  # pylint: disable=g-import-not-at-top
  import portpicker
  import test_distributed as td
  from run_helpers import metrics_rows
  worker = td.Worker(portpicker.pick_unused_port()).start()
  try:
    common = td._FLAGS + [f'--root_output_dir={tmp_path}', '--total_rounds=2']
    code, _, err = td._run(common + ['--experiment_name=local'])
    assert code == 0, err[-2000:]
    code, _, err = td._run(common + ['--experiment_name=ids', '--datasets_on_workers',
                                     f'--workers=127.0.0.1:{worker.port}'])
    assert code == 0, err[-2000:]
  finally:
    worker.stop()
  with open(tmp_path / 'ids' / 'config.json') as f:
    assert json.load(f)['datasets_on_workers'] is True
  td._assert_same_training(metrics_rows(tmp_path / 'local'), metrics_rows(tmp_path / 'ids'))
  assert (ledger_lib.read_ledger(str(tmp_path / 'local' / 'ledger.jsonl'))
          == ledger_lib.read_ledger(str(tmp_path / 'ids' / 'ledger.jsonl')))
