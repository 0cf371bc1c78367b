"""Tasks on TFF's real loaders over databases we write in TFF's on-disk format."""

import os
import sqlite3
import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tasks
from tasks import data_files
from tasks import sql_client_data
from tasks import synthetic_data
from tasks import stackoverflow as so_task
from tasks import vocab as vocab_lib
from tff_dp.errors import UserInputError

SO = tff.simulation.datasets.stackoverflow
EMNIST = tff.simulation.datasets.emnist


def _emnist_proto(e):
  return synthetic_data.emnist_example(e['pixels'], int(e['label']))


def _so_proto(e):
  return synthetic_data.stackoverflow_example(
      tokens=e['tokens'].decode(), title=e['title'].decode(), tags=e['tags'].decode(),
      score=int(e['score']), creation_date=e['creation_date'].decode(),
      type_=e['type'].decode())


def _assert_same_client_data(loaded, reference):
  assert sorted(loaded.client_ids) == sorted(reference.client_ids)
  assert loaded.element_type_structure == reference.element_type_structure
  for cid in reference.client_ids:
    got = list(loaded.create_tf_dataset_for_client(cid).as_numpy_iterator())
    want = list(reference.create_tf_dataset_for_client(cid).as_numpy_iterator())
    assert len(got) == len(want)
    for g, w in zip(got, want):
      assert set(g) == set(w)
      for key in w:
        np.testing.assert_array_equal(g[key], w[key])
        assert np.asarray(g[key]).dtype == np.asarray(w[key]).dtype


def test_emnist_round_trip_matches_get_synthetic(tmp_path):
  reference = EMNIST.get_synthetic()
  protos = synthetic_data.client_data_to_protos(reference, _emnist_proto)
  synthetic_data.write_sqlite(str(tmp_path / 'emnist_all.sqlite'), {
      split: protos for split in ('all_train', 'all_test', 'digits_only_train',
                                  'digits_only_test')})
  for only_digits in (False, True):
    train, test = EMNIST.load_data(only_digits=only_digits, cache_dir=str(tmp_path))
    _assert_same_client_data(train, reference)
    _assert_same_client_data(test, reference)


def test_stackoverflow_round_trip_matches_get_synthetic(tmp_path):
  reference = SO.get_synthetic()
  protos = synthetic_data.client_data_to_protos(reference, _so_proto)
  synthetic_data.write_sqlite(str(tmp_path / 'stackoverflow.sqlite'),
                              {split: protos for split in ('train', 'heldout', 'test')})
  train, heldout, test = SO.load_data(cache_dir=str(tmp_path))
  for loaded in (train, heldout, test):
    _assert_same_client_data(loaded, reference)


def test_generated_metadata_counts_match_examples(tmp_path):
  path = synthetic_data.write_emnist_cache(str(tmp_path), num_train_clients=4,
                                           examples_per_client=7, seed=3)
  with sqlite3.connect(path) as con:
    meta = dict(((c, s), n) for c, s, n in con.execute('SELECT * FROM client_metadata'))
    for (cid, split), n in meta.items():
      count = con.execute('SELECT COUNT(*) FROM examples WHERE client_id=? AND split_name=?',
                          (cid, split)).fetchone()[0]
      assert count == n
  train, _ = EMNIST.load_data(only_digits=False, cache_dir=str(tmp_path))
  assert len(train.client_ids) == 4
  assert all(meta[(c, 'all_train')] == 7 for c in train.client_ids)


def test_generation_is_deterministic(tmp_path):
  a = synthetic_data.write_emnist_cache(str(tmp_path / 'a'), 3, 5, seed=1)
  b = synthetic_data.write_emnist_cache(str(tmp_path / 'b'), 3, 5, seed=1)
  with sqlite3.connect(a) as ca, sqlite3.connect(b) as cb:
    q = 'SELECT * FROM examples ORDER BY rowid'
    assert ca.execute(q).fetchall() == cb.execute(q).fetchall()


def test_word_counts_match_tff_parser_format(tmp_path):
  counts = {'the': 10, 'a': 7, 'foo': 1}
  synthetic_data.write_counts_file(str(tmp_path / 'datasets' / 'stackoverflow.word_count'),
                                   counts)
  assert dict(vocab_lib.load_word_counts(str(tmp_path))) == counts
  assert list(vocab_lib.load_word_counts(str(tmp_path), vocab_size=2)) == ['the', 'a']


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('cache'))
  synthetic_data.write_emnist_cache(path, num_train_clients=3, examples_per_client=12, seed=0)
  synthetic_data.write_stackoverflow_cache(path, num_train_clients=3, examples_per_client=6,
                                           seed=0, vocab_size=300, num_tags=50, num_topics=5)
  return path


def _param_count(task):
  return sum(int(np.prod(w.shape)) for w in task.keras_model_fn().trainable_weights)


def test_emnist_task_batches_and_model(cache):
  task = tasks.build_task('emnist', cache, client_batch_size=5, only_digits=True)
  batch = next(iter(task.preprocess_train(
      task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]))))
  assert batch[0].shape[1:] == (28, 28, 1) and batch[0].dtype == tf.float32
  assert _param_count(task) == 320 + 18_496 + 1_179_776 + 1_290   # The cnn_dropout CNN.
  assert task.keras_model_fn()(batch[0]).shape[-1] == 10
  assert _param_count(tasks.build_task('emnist', cache)) == 320 + 18_496 + 1_179_776 + 7_998


def test_stackoverflow_word_task_model_and_vocab(cache):
  task = tasks.build_task('stackoverflow_word', cache, vocab_size=300, sequence_length=8)
  # The cache's 300 words, the most used first (the order of its count file).
  assert sorted(task.vocab) == sorted(f'w{i}' for i in range(300))
  counts = [task.word_counts[w] for w in task.vocab]
  assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]
  x, y = next(iter(task.preprocess_train(
      task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]))))
  assert x.shape[1] == 8 and y.shape[1] == 8
  model = task.keras_model_fn()
  assert model(x).shape[-1] == 300 + 4   # pad, oov, bos, eos
  layers = [l for l in model.layers if l.weights]
  assert [type(l).__name__ for l in layers] == ['Embedding', 'LSTM', 'Dense', 'Dense']
  assert layers[0].output_dim == 96 and layers[1].units == 670 and layers[2].units == 96
  # A smaller model of the same shape (settings so_embedding_size, so_lstm_size).
  small = tasks.build_task('stackoverflow_word', cache, vocab_size=300, sequence_length=8,
                           embedding_size=12, latent_size=20).keras_model_fn()
  layers = [l for l in small.layers if l.weights]
  assert [type(l).__name__ for l in layers] == ['Embedding', 'LSTM', 'Dense', 'Dense']
  assert layers[0].output_dim == 12 and layers[1].units == 20 and layers[2].units == 12
  assert small(x).shape[-1] == 300 + 4


def test_word_accuracy_excludes_special_tokens(cache):
  task = tasks.build_task('stackoverflow_word', cache, vocab_size=300, sequence_length=8)
  accuracy = [m for m in task.metrics_fn() if m.name == 'accuracy'][0]
  pad, oov, bos, eos = 0, 301, 302, 303
  y_true = tf.constant([[5, 6, pad, oov, bos, eos]])
  # Correct on the two real words, wrong on every special token.
  predicted = tf.constant([[5, 6, 9, 9, 9, 9]])
  accuracy.update_state(y_true, tf.one_hot(predicted, 304))
  assert float(accuracy.result()) == pytest.approx(1.0)
  accuracy.reset_state()
  accuracy.update_state(y_true, tf.one_hot(tf.constant([[5, 7, pad, oov, bos, eos]]), 304))
  assert float(accuracy.result()) == pytest.approx(0.5)


def test_stackoverflow_tag_task(cache):
  task = tasks.build_task('stackoverflow_tag', cache, word_vocab_size=300, tag_vocab_size=50)
  x, y = next(iter(task.preprocess_train(
      task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0]))))
  assert x.shape[1] == 300 and y.shape[1] == 50
  assert _param_count(task) == 300 * 50 + 50
  assert len(task.tag_counts) == 50 and len(task.word_counts) == 300


def test_unknown_task_and_missing_dir(tmp_path):
  with pytest.raises(UserInputError, match='unknown `task`'):
    tasks.build_task('mnist', str(tmp_path))
  with pytest.raises(UserInputError, match='does not exist'):
    tasks.build_task('emnist', str(tmp_path / 'nope'))
  with pytest.raises(UserInputError, match='emnist_all.sqlite not found'):
    tasks.build_task('emnist', str(tmp_path))


@pytest.mark.parametrize('damage', ['truncate', 'garbage', 'no_table', 'no_split'])
def test_bad_database_is_one_clear_error(tmp_path, damage):
  path = synthetic_data.write_emnist_cache(str(tmp_path), 3, 5, seed=0)
  data = open(path, 'rb').read()
  if damage == 'truncate':
    open(path, 'wb').write(data[:len(data) // 2])
  elif damage == 'garbage':
    open(path, 'wb').write(b'\x00garbage' * 1000)
  elif damage == 'no_table':
    with sqlite3.connect(path) as con:
      con.execute('DROP TABLE client_metadata')
  else:
    with sqlite3.connect(path) as con:
      con.execute("DELETE FROM client_metadata WHERE split_name='all_test'")
  with pytest.raises(UserInputError) as e:
    tasks.build_task('emnist', str(tmp_path))
  assert 'emnist_all.sqlite' in str(e.value)
  assert '\n' not in str(e.value)


def _deny(monkeypatch, path, kind):
  """`path` unreadable to this process: by its mode, or, for root (whom modes do not stop),
  by the failure the system would give."""
  if os.geteuid() != 0:
    os.chmod(path, 0)
    return
  if kind == 'dir':
    monkeypatch.setattr(data_files.os, 'access', lambda p, mode: os.fspath(p) != str(path))
  else:
    def denied(p, *a, **k):
      if os.fspath(p) == str(path):
        raise PermissionError(13, 'Permission denied', str(p))
      return open(p, *a, **k)
    monkeypatch.setattr(data_files, 'open', denied, raising=False)


@pytest.mark.parametrize('case', ['file_unreadable', 'dir_unreadable', 'file_is_a_dir'])
def test_an_unreadable_data_file_or_directory_is_named_as_such(tmp_path, monkeypatch, case):
  """A new user's trial: an unreadable emnist_all.sqlite gave a PermissionError traceback, and
  an unreadable directory or a directory in the file's place was "not found"."""
  data_dir = tmp_path / 'data'
  data_dir.mkdir()
  if case == 'file_is_a_dir':
    (data_dir / 'emnist_all.sqlite').mkdir()
    expected = 'emnist_all.sqlite is a directory'
  else:
    path = synthetic_data.write_emnist_cache(str(data_dir), 2, 3, seed=0)
    _deny(monkeypatch, data_dir if case == 'dir_unreadable' else path,
          'dir' if case == 'dir_unreadable' else 'file')
    expected = 'cannot be read'
  with pytest.raises(UserInputError, match=expected) as e:
    data_files.check_task_data('emnist', str(data_dir))
  assert 'not found' not in str(e.value)


def test_check_sqlite_file_accepts_generated(tmp_path):
  path = synthetic_data.write_emnist_cache(str(tmp_path), 2, 3, seed=0)
  data_files.check_sqlite_file(path, ('all_train', 'all_test'))


def test_registry_options_are_builder_keywords_and_config_settings():
  """Each task's options (tasks.TASKS) are keywords of its builder and settings of the tasks'
  own config section (`tasks.TaskSettings`), and each is registered with the library."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  import inspect  # pylint: disable=g-import-not-at-top
  from tff_dp.training import task_registry  # pylint: disable=g-import-not-at-top
  fields = {f.name for f in dataclasses.fields(tasks.TaskSettings)}
  for name, spec in tasks.TASKS.items():
    builder = getattr(importlib.import_module(f'tasks.{spec.module}'), spec.builder)
    assert set(spec.options) <= set(inspect.signature(builder).parameters), name
    assert set(spec.options.values()) <= fields, name
    assert task_registry.get(name).options == spec.options, name


def test_load_builds_from_the_data_dir_or_the_embedded_dataset(cache, tmp_path):
  built = tasks.load('emnist', cache, client_batch_size=5, only_digits=True)
  assert built.name == 'emnist' and len(built.train_data.client_ids) > 0
  # No data_dir: the embedded dataset (100 EMNIST writers) is generated where asked, once.
  embedded = tasks.load('emnist', embedded_data_dir=str(tmp_path / 'e'))
  assert len(embedded.train_data.client_ids) == 100
  assert os.path.exists(tmp_path / 'e' / 'emnist_all.sqlite')


def test_unknown_task_option_is_user_error(cache):
  with pytest.raises(UserInputError, match='no option'):
    tasks.build_task('emnist', cache, vocab_size=10)


def test_missing_word_counts_is_user_error(tmp_path):
  synthetic_data.write_stackoverflow_cache(str(tmp_path), num_train_clients=2,
                                           examples_per_client=2, seed=0, vocab_size=50,
                                           num_tags=45, num_topics=4)
  os.remove(str(tmp_path / 'datasets' / 'stackoverflow.word_count'))
  with pytest.raises(UserInputError, match='no download'):
    tasks.build_task('stackoverflow_tag', str(tmp_path), word_vocab_size=50, tag_vocab_size=45)


def _first_batch_labels(task):
  ds = task.train_data.create_tf_dataset_for_client(task.train_data.client_ids[0])
  return [str(row) for b in task.preprocess_train(ds) for row in b[1].numpy().tolist()]


@pytest.mark.parametrize('name,options', [
    ('emnist', {}), ('stackoverflow_tag', dict(word_vocab_size=300, tag_vocab_size=50))])
def test_shuffle_seed_makes_client_data_order_reproducible(cache, name, options):
  def run(seed):
    task = tasks.build_task(name, cache, client_batch_size=4, shuffle_seed=seed, **options)
    return _first_batch_labels(task)
  assert run(7) == run(7)
  unshuffled = tasks.build_task(name, cache, client_batch_size=4, shuffle_buffer_size=1,
                                **options)
  assert sorted(run(7)) == sorted(_first_batch_labels(unshuffled))


def test_keras_model_fn_is_fresh_and_model_fn_is_tff_model(cache):
  task = tasks.build_task('emnist', cache, only_digits=True)
  assert task.keras_model_fn() is not task.keras_model_fn()
  model = task.model_fn()
  assert isinstance(model, tff.learning.models.VariableModel)
  assert 'accuracy' in [m.name for m in task.metrics_fn()]


def test_damaged_counts_archive_is_user_error_not_download(tmp_path):
  archive = tmp_path / 'datasets' / 'stackoverflow.word_count.tar.bz2'
  archive.parent.mkdir()
  archive.write_bytes(b'BZh9 truncated')
  with pytest.raises(UserInputError, match='sha256'):
    vocab_lib.load_word_counts(str(tmp_path), vocab_size=10)


def test_ensure_default_cache_builds_once(tmp_path, monkeypatch):
  monkeypatch.setitem(synthetic_data.DEFAULT_SIZES, 'emnist',
                      dict(num_train_clients=2, examples_per_client=3, num_test_clients=2))
  synthetic_data.ensure_default_cache(str(tmp_path), 'emnist')
  db = tmp_path / 'emnist_all.sqlite'
  first = db.stat().st_mtime_ns
  synthetic_data.ensure_default_cache(str(tmp_path), 'emnist')
  assert db.stat().st_mtime_ns == first
  with pytest.raises(UserInputError):
    synthetic_data.ensure_default_cache(str(tmp_path), 'mnist')


def test_concurrent_builders_of_one_cache_wait_and_build_it_once(tmp_path, monkeypatch):
  """Two runs started at once on a fresh checkout (or two test workers) share the embedded
  cache: while one builds it, the other waits, then finds it finished instead of rewriting."""
  monkeypatch.setitem(synthetic_data.DEFAULT_SIZES, 'emnist',
                      dict(num_train_clients=2, examples_per_client=3, num_test_clients=2))
  writes = []
  real_writer = synthetic_data.write_emnist_cache
  monkeypatch.setattr(synthetic_data, 'write_emnist_cache',
                      lambda *a, **k: writes.append(1) or real_writer(*a, **k))
  builders = [threading.Thread(target=synthetic_data.ensure_default_cache,
                               args=(str(tmp_path), 'emnist')) for _ in range(2)]
  with synthetic_data._exclusive(str(tmp_path)):   # Another process is building it.
    for b in builders:
      b.start()
    builders[0].join(timeout=1.0)
    assert builders[0].is_alive() and not writes   # Waiting, nothing written.
  for b in builders:
    b.join(timeout=60)
  assert writes == [1]
  train, _ = tff.simulation.datasets.emnist.load_data(only_digits=False, cache_dir=str(tmp_path))
  assert len(train.client_ids) == 2


# ---------------------------------------------------------------------------------------------
# Client ids that TFF's SqlClientData pastes into SQL text: each client reads exactly its rows.

ODD_IDS = ["o'brien", "x' OR '1'='1", 'x', 'zoë 数据 😀', 'two  spaces ', 'q' * 199 + "'",
           "'; DROP TABLE examples; --"]


def _odd_emnist_cache(path, ids=ODD_IDS):
  """emnist_all.sqlite where client i has i + 2 examples with label (i % 10), distinct pixels."""
  rng = np.random.default_rng(11)
  clients = {cid: [synthetic_data.emnist_example(rng.uniform(0, 1, (28, 28)), i % 10)
                   for _ in range(i + 2)] for i, cid in enumerate(ids)}
  synthetic_data.write_sqlite(os.path.join(path, 'emnist_all.sqlite'), {
      split: clients for split in ('all_train', 'all_test', 'digits_only_train',
                                   'digits_only_test')})
  return os.path.join(path, 'emnist_all.sqlite')


def _rows(db, split, cid):
  """The client's protos read with sqlite3's bound parameters (the reference), parsed by the
  protobuf library (not by TFF's parsing)."""
  with sqlite3.connect(db) as con:
    rows = con.execute('SELECT serialized_example_proto FROM examples WHERE split_name=? AND '
                       'client_id=? ORDER BY rowid', (split, cid)).fetchall()
  con.close()
  return [tf.train.Example.FromString(r[0]).features.feature for r in rows]


def test_emnist_client_reads_exactly_its_own_rows_for_any_id(tmp_path):
  db = _odd_emnist_cache(str(tmp_path))
  task = tasks.build_task('emnist', str(tmp_path))
  assert sorted(task.train_data.client_ids) == sorted(ODD_IDS)
  raw_train, _ = EMNIST.load_data(only_digits=False, cache_dir=str(tmp_path))
  assert task.train_data.element_type_structure == raw_train.element_type_structure
  for cid in ODD_IDS:
    got = list(task.train_data.create_tf_dataset_for_client(cid).as_numpy_iterator())
    want = _rows(db, 'all_train', cid)
    assert len(got) == len(want) == ODD_IDS.index(cid) + 2, cid
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g['pixels'].ravel(), np.float32(w['pixels'].float_list.value))
      assert g['label'] == w['label'].int64_list.value[0]
  # The evaluation path reads every client through the traced `serializable_dataset_fn`.
  everything = list(task.test_data.create_tf_dataset_from_all_clients(seed=0).as_numpy_iterator())
  with sqlite3.connect(db) as con:
    labels = [tf.train.Example.FromString(r[0]).features.feature['label'].int64_list.value[0]
              for r in con.execute("SELECT serialized_example_proto FROM examples "
                                   "WHERE split_name='all_test'")]
  con.close()
  assert sorted(int(e['label']) for e in everything) == sorted(labels)


def test_stackoverflow_client_reads_exactly_its_own_rows_for_any_id(tmp_path):
  clients = {cid: [synthetic_data.stackoverflow_example(tokens=f'w{i} w{j}', title=cid, tags='t1')
                   for j in range(i + 1)] for i, cid in enumerate(ODD_IDS)}
  db = str(tmp_path / 'stackoverflow.sqlite')
  synthetic_data.write_sqlite(db, {split: clients for split in ('train', 'heldout', 'test')})
  train, test = so_task._load(str(tmp_path))   # pylint: disable=protected-access
  for data, split in ((train, 'train'), (test, 'test')):
    for cid in ODD_IDS:
      got = list(data.create_tf_dataset_for_client(cid).as_numpy_iterator())
      want = _rows(db, split, cid)
      assert [(g['tokens'], g['title']) for g in got] == [
          (w['tokens'].bytes_list.value[0], w['title'].bytes_list.value[0]) for w in want]


@pytest.mark.parametrize('encoding', ['UTF-16le', 'UTF-16be'])
def test_client_query_matches_ids_in_utf16_databases(tmp_path, encoding):
  db = str(tmp_path / 'emnist_all.sqlite')
  proto = synthetic_data.emnist_example(np.zeros((28, 28)), 1)
  with sqlite3.connect(db) as con:
    con.execute(f"PRAGMA encoding = '{encoding}'")   # Before any table: fixes the encoding.
    con.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
                'serialized_example_proto BLOB NOT NULL);')
    con.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, '
                'split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);')
    for split in ('all_train', 'all_test'):
      for i, cid in enumerate(ODD_IDS):
        con.executemany('INSERT INTO examples VALUES (?, ?, ?)', [(split, cid, proto)] * (i + 1))
        con.execute('INSERT INTO client_metadata VALUES (?, ?, ?)', (cid, split, i + 1))
    assert con.execute('PRAGMA encoding').fetchone()[0] == encoding
  con.close()
  train, _ = EMNIST.load_data(only_digits=False, cache_dir=str(tmp_path))
  safe = sql_client_data.safe_client_data(train)
  assert [len(list(safe.create_tf_dataset_for_client(c))) for c in ODD_IDS] == [
      len(_rows(db, 'all_train', c)) for c in ODD_IDS] == list(range(1, len(ODD_IDS) + 1))
  sql = safe._underlying_client_data  # pylint: disable=protected-access
  for cid in ODD_IDS:   # The traced-id query transcodes in graph ops to the same text.
    assert sql.query(tf.constant(cid)).numpy().decode() == sql.query(cid)
  assert len(list(safe.create_tf_dataset_from_all_clients(seed=0))) == sum(
      range(1, len(ODD_IDS) + 1))


def test_generated_caches_index_the_client_lookup(tmp_path):
  db = _odd_emnist_cache(str(tmp_path))
  with sqlite3.connect(db) as con:
    indexed = [[c[2] for c in con.execute(f"PRAGMA index_info('{name}')")]
               for _, name, *_ in con.execute('PRAGMA index_list(examples)')]
  con.close()
  assert ['split_name', 'client_id'] in indexed
  train, _ = EMNIST.load_data(only_digits=False, cache_dir=str(tmp_path))
  safe = sql_client_data.safe_client_data(train)
  sql = safe._underlying_client_data  # pylint: disable=protected-access
  query = sql.query(ODD_IDS[1])
  assert ODD_IDS[1] not in query and "'1'='1" not in query
  for cid in ODD_IDS:   # The traced-id query (graph ops) is the same text as the Python one.
    assert sql.query(tf.constant(cid)).numpy().decode() == sql.query(cid)
  with sqlite3.connect(db) as con:
    plan = ' '.join(str(r[-1]) for r in con.execute('EXPLAIN QUERY PLAN ' + query))
    rows = con.execute(query).fetchall()
  con.close()
  assert 'USING INDEX' in plan and 'TEMP B-TREE' not in plan, plan   # No scan, no sort.
  assert len(rows) == len(_rows(db, 'all_train', ODD_IDS[1])) == 3


@pytest.mark.parametrize('name,options', [
    ('emnist', {}), ('stackoverflow_word', dict(vocab_size=300)),
    ('stackoverflow_tag', dict(word_vocab_size=300, tag_vocab_size=50))])
def test_train_dataset_for_client_is_the_eager_pipeline(cache, name, options):
  task = tasks.build_task(name, cache, client_batch_size=4, shuffle_seed=3, **options)
  assert task.traceable_train_data
  for cid in task.train_data.client_ids:
    eager = task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))
    traced = task.train_dataset_for_client(cid)
    assert traced.element_spec == eager.element_spec
    got, want = list(traced.as_numpy_iterator()), list(eager.as_numpy_iterator())
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
      tf.nest.map_structure(np.testing.assert_array_equal, g, w)
  with pytest.raises(ValueError, match='not a client'):
    task.train_dataset_for_client('no such client')


def test_the_tasks_settings_are_declared_by_the_tasks_not_by_the_library():
  """Issues 26.4 and 38.5: a task's options live with the task. `tasks.TaskSettings` declares
  each setting once, as the tasks' own typed config section; the library names none of them,
  and every declaration is some task's option."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  import glob  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  from run_helpers import REPO  # pylint: disable=g-import-not-at-top
  from tff_dp.training import config as config_lib  # pylint: disable=g-import-not-at-top
  library = ''
  for path in glob.glob(os.path.join(REPO, 'tff_dp', '**', '*.py'), recursive=True):
    with open(path) as f:
      library += f.read()
  declared = {f.name for f in dataclasses.fields(tasks.TaskSettings)}
  for name in declared:
    assert name not in library, name
  assert config_lib.all_sections()[tasks.TaskSettings.SECTION] is tasks.TaskSettings
  assert declared <= set(config_lib.ExperimentConfig.from_settings(dp='none').settings())
  used = {field for spec in tasks.TASKS.values() for field in spec.options.values()}
  assert used == declared   # Every option comes from a declaration, every declaration is used.