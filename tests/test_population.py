"""Population-sized synthetic caches (issue 13.6): same generators, streamed, real loaders."""

import hashlib
import os
import sqlite3

import pytest
import tensorflow_federated as tff

import tasks
from tasks import data_files
from tasks import sql_client_data
from tasks import synthetic_data
from tff_dp.errors import UserInputError


def _digest(db: str, test_id_prefix: str = None) -> str:
  """SHA-256 of every row; `test_id_prefix` renames the test split's ids back to the prefix
  they had before the test split held the training users' ids (the rows are otherwise the
  same)."""
  h = hashlib.sha256()
  with sqlite3.connect(db) as con:
    for split, cid, proto in con.execute('SELECT split_name, client_id, '
                                         'serialized_example_proto FROM examples ORDER BY rowid'):
      if test_id_prefix is not None and split == 'test':
        cid = test_id_prefix + cid[len(test_id_prefix):]
      h.update(split.encode())
      h.update(cid.encode())
      h.update(proto)
  return h.hexdigest()


def _file_digest(path: str) -> str:
  with open(path, 'rb') as f:
    return hashlib.sha256(f.read()).hexdigest()


def test_generated_data_unchanged_by_the_streaming_fast_generator(tmp_path):
  # Digests of what the generators wrote before they streamed rows and spelled out numpy's
  # Generator.choice (same random stream): the embedded dataset, and every result measured on
  # it, is the same.
  so = synthetic_data.write_stackoverflow_cache(str(tmp_path), num_train_clients=60,
                                                examples_per_client=40, num_test_clients=20,
                                                num_heldout_clients=10)
  em = synthetic_data.write_emnist_cache(str(tmp_path), num_train_clients=30,
                                         examples_per_client=20, seed=3)
  # The StackOverflow test split now holds training users' ids (as TFF's does, issue 24): with
  # the old 'te' prefix restored, every row is as before.
  assert _digest(so, test_id_prefix='te') == (
      '3967130522839aa89cf0c177d4d7643f076837df6c5ddfda21827daec711bb1b')
  with sqlite3.connect(so) as con:
    ids = {split: {c for (c,) in con.execute(
        'SELECT DISTINCT client_id FROM examples WHERE split_name = ?', (split,))}
           for split in ('train', 'heldout', 'test')}
  assert ids['test'] <= ids['train'] and not ids['heldout'] & ids['train']
  assert _digest(em) == 'dc0fc6b00d795fa4b4505c8a8d5ba991a97abc30434a847abef473561d734b26'
  datasets = tmp_path / 'datasets'
  assert _file_digest(datasets / 'stackoverflow.word_count') == (
      '9555094f05c80939cd682affdaa36b9949197a8dea7345f01ccbf5c02dcd6780')
  assert _file_digest(datasets / 'stackoverflow.tag_count') == (
      '0f892203bda77d318be11caf8ff94339208778348050bc76956c3ab921659eb8')


def test_full_sizes_are_the_real_datasets_client_counts():
  so = synthetic_data.population_sizes('stackoverflow', 'full')
  assert (so['num_train_clients'], so['num_heldout_clients'], so['num_test_clients']) == (
      342477, 38758, 204088)
  em = synthetic_data.population_sizes('emnist', 'full')
  assert (em['num_train_clients'], em['num_test_clients']) == (3400, 3400)
  small = synthetic_data.population_sizes('stackoverflow', 1000)
  assert small['num_train_clients'] == 1000
  assert small['num_test_clients'] == round(204088 * 1000 / 342477)
  assert small['examples_per_client'] == so['examples_per_client']
  with pytest.raises(UserInputError):
    synthetic_data.population_sizes('stackoverflow', 'huge')
  with pytest.raises(UserInputError):
    synthetic_data.population_sizes('mnist', 'full')


def test_write_sqlite_streams_an_iterable_like_a_mapping(tmp_path):
  clients = {'train': {f'c{i}': [bytes([i, j]) for j in range(i % 3 + 1)] for i in range(7)}}
  synthetic_data.write_sqlite(str(tmp_path / 'a.sqlite'), clients)
  rows = ((s, c, p) for s, cs in clients.items() for c, p in cs.items())
  synthetic_data.write_sqlite(str(tmp_path / 'b.sqlite'), rows, batch_rows=2)
  for table in ('examples', 'client_metadata'):
    q = f'SELECT * FROM {table} ORDER BY rowid'
    with sqlite3.connect(tmp_path / 'a.sqlite') as a, sqlite3.connect(tmp_path / 'b.sqlite') as b:
      assert a.execute(q).fetchall() == b.execute(q).fetchall()


def test_failed_generation_leaves_no_file(tmp_path):
  def rows():
    yield 'train', 'a', [b'x']
    raise RuntimeError('generator failed')
  with pytest.raises(RuntimeError):
    synthetic_data.write_sqlite(str(tmp_path / 'c.sqlite'), rows(), batch_rows=1)
  assert os.listdir(tmp_path) == []


def test_population_cache_of_the_full_shape_loads_through_the_real_loader(tmp_path):
  # The full-size StackOverflow shape (2 examples per client, real split proportions) at a
  # small population, read by TFF's load_data and our task code.
  d = str(tmp_path / 'so')
  synthetic_data.ensure_population_cache(d, 'stackoverflow', 300)
  sizes = synthetic_data.population_sizes('stackoverflow', 300)
  train, heldout, test = tff.simulation.datasets.stackoverflow.load_data(cache_dir=d)
  assert len(train.client_ids) == 300
  assert len(heldout.client_ids) == sizes['num_heldout_clients']
  assert len(test.client_ids) == sizes['num_test_clients']
  task = tasks.build_task('stackoverflow_tag', d)
  cid = task.train_data.client_ids[123]
  assert len(list(task.train_data.create_tf_dataset_for_client(cid))) == 2
  batches = list(task.train_dataset_for_client(cid))
  assert sum(int(x.shape[0]) for x, _ in batches) == 2
  # A client's rows are found through the index, not by scanning the table.
  safe = sql_client_data.SafeSqlClientData(os.path.join(d, 'stackoverflow.sqlite'), 'train',
                                           [cid])
  with sqlite3.connect(os.path.join(d, 'stackoverflow.sqlite')) as con:
    plan = ' '.join(str(r) for r in con.execute('EXPLAIN QUERY PLAN ' + safe.query(cid)))
  assert 'USING INDEX examples_split_client' in plan

  e = str(tmp_path / 'em')
  synthetic_data.ensure_population_cache(e, 'emnist', 40)
  task = tasks.build_task('emnist', e)
  assert len(task.train_data.client_ids) == 40 == len(task.test_data.client_ids)
  first = task.train_data.client_ids[0]
  assert len(list(task.train_data.create_tf_dataset_for_client(first))) == (
      synthetic_data.FULL_SIZES['emnist']['examples_per_client'])


def test_population_cache_is_reused_and_regenerated_when_settings_change(tmp_path):
  d = str(tmp_path)
  db = os.path.join(d, 'emnist_all.sqlite')
  synthetic_data.ensure_population_cache(d, 'emnist', 5)
  stamp = os.stat(db).st_mtime_ns
  synthetic_data.ensure_population_cache(d, 'emnist', 5)
  assert os.stat(db).st_mtime_ns == stamp
  synthetic_data.ensure_population_cache(d, 'emnist', 6)
  with sqlite3.connect(db) as con:
    assert con.execute("SELECT COUNT(*) FROM client_metadata WHERE split_name = 'all_train'"
                       ).fetchone()[0] == 6
  data_files.check_sqlite_file(db, ('all_train', 'all_test'))


def test_cli_generates_and_rejects_bad_population(tmp_path, capsys):
  assert synthetic_data.main(['--family=emnist', '--population=3',
                              f'--cache_dir={tmp_path}']) == 0
  assert os.path.exists(tmp_path / 'emnist_all.sqlite')
  assert synthetic_data.main(['--family=emnist', '--population=0',
                              f'--cache_dir={tmp_path}']) == 2
  assert 'error: population must be positive' in capsys.readouterr().err


def test_quick_check_only_below_the_size_limit(tmp_path, monkeypatch):
  # quick_check reads the whole file at every start; above the limit only header, schema and
  # splits are checked (a damaged page then rejects the client that reads it).
  db = synthetic_data.write_emnist_cache(str(tmp_path), num_train_clients=4,
                                         examples_per_client=5)
  size = os.path.getsize(db)
  with open(db, 'r+b') as f:   # Damage the header of a page holding examples.
    f.seek(10 * 4096)
    f.write(b'\xff' * 16)
  with pytest.raises(UserInputError, match='corrupt'):
    data_files.check_sqlite_file(db, ('all_train',))
  monkeypatch.setattr(data_files, 'QUICK_CHECK_MAX_BYTES', size - 1)
  data_files.check_sqlite_file(db, ('all_train',))


def test_add_index_to_a_file_without_one(tmp_path):
  # TFF's downloaded files have no index: a client read scans the table. The opt-in tool adds
  # the one our generated caches carry; the loader's results are unchanged.
  db = str(tmp_path / 'stackoverflow.sqlite')
  synthetic_data.write_stackoverflow_cache(str(tmp_path), num_train_clients=5,
                                           examples_per_client=3)
  with sqlite3.connect(db) as con:
    con.execute(f'DROP INDEX {data_files.INDEX_NAME}')
  con.close()
  safe = sql_client_data.SafeSqlClientData(db, 'train', ['tr00001_0'])
  def plan():
    with sqlite3.connect(db) as con:
      return ' '.join(str(r) for r in con.execute('EXPLAIN QUERY PLAN ' +
                                                  safe.query('tr00001_0')))
  assert 'INDEX' not in plan()
  before = list(safe.create_tf_dataset_for_client('tr00001_0').as_numpy_iterator())
  assert data_files.main([db, '--add_index']) == 0
  assert 'USING INDEX' in plan()
  assert data_files.add_client_index(db) is False   # Already there.
  assert list(safe.create_tf_dataset_for_client('tr00001_0').as_numpy_iterator()) == before
  assert data_files.main([str(tmp_path / 'missing.sqlite'), '--add_index']) == 2


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_client_slices_match_the_unsliced_run(tmp_path):
  # --client_slices=3: the round's clients run in 3 sequential slices on the local worker
  # (TFF's mergeable context), bounding the worker's memory to a slice; same training up to
  # float summation order (noise off, seeded samples, logistic regression without dropout).
  import pytest as _pytest  # pylint: disable=g-import-not-at-top,reimported
  from run_helpers import main_in_process, metrics_rows  # pylint: disable=g-import-not-at-top
  # A small model (1,000 words, 50 tags): the slicing, not the model, is under test.
  flags = ['--task=stackoverflow_tag', '--so_vocab_size=1000', '--so_tag_vocab_size=50',
           '--dp=adaptive', '--clip=0.5', '--noise_multiplier=0',
           '--clipped_count_stddev=0', '--clients_per_round=6', '--client_sampling=fixed_size',
           '--max_eval_examples=200', '--client_batch_size=10', '--max_elements_per_client=30',
           '--client_learning_rate=1.0', '--delta=1e-3', '--sampling_seed=0',
           '--total_rounds=3', f'--root_output_dir={tmp_path}']
  rows = {}
  for name, extra in (('plain', []), ('sliced', ['--client_slices=3'])):
    code, _, err = main_in_process('run_experiment.py',
                                   flags + [f'--experiment_name={name}'] + extra)
    assert code == 0, err[-2000:]
    rows[name] = metrics_rows(tmp_path / name)
  assert [r['round'] for r in rows['plain']] == [r['round'] for r in rows['sliced']] == [
      '1', '2', '3']
  for a, b in zip(rows['plain'], rows['sliced']):
    keys = ['train_loss', 'eval_loss', 'eval_accuracy'] + [
        k for k in a if k.endswith('update/l2_norm_clip')]
    for k in keys:
      assert float(a[k]) == _pytest.approx(float(b[k]), rel=1e-5, abs=1e-6), (a['round'], k)
  code, _, err = main_in_process('run_experiment.py',
                                 flags + ['--experiment_name=bad', '--client_slices=0'])
  assert code == 2 and 'error: --client_slices must be >= 1' in err


def test_client_slices_install_the_mergeable_context():
  from tensorflow_federated.python.core.impl.execution_contexts import (  # pylint: disable=g-import-not-at-top
      mergeable_comp_execution_context as mergeable)
  from tff_dp.execution import runtime  # pylint: disable=g-import-not-at-top
  try:
    runtime.configure_execution_context(client_slices=3)
    context = tff.framework.get_context_stack().current
    assert isinstance(context, mergeable.MergeableCompExecutionContext)
    assert context._num_subrounds == 3  # pylint: disable=protected-access
    with pytest.raises(ValueError):
      runtime.configure_execution_context(client_slices=0)
  finally:
    runtime.configure_execution_context()
