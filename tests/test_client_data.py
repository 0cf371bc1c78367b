"""ClientDatasets: LRU cache of preprocessed client pipelines with one-round-ahead prefetch."""

import threading

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import synthetic_data
from tff_dp.training.builders.client_data import check_client_dataset
from tff_dp.training.builders.client_data import ClientDatasets


class _Builder:
  def __init__(self, fail_on=None):
    self.calls, self.threads, self.fail_on = [], set(), fail_on

  def __call__(self, cid):
    self.calls.append(cid)
    self.threads.add(threading.current_thread().name)
    if cid == self.fail_on:
      raise ValueError(f'client {cid} has no examples')
    return tf.data.Dataset.range(int(cid[1:])).map(lambda x: x * 2)


def test_prefetched_and_cached_datasets_are_built_once_and_yield_the_same_data():
  build = _Builder()
  data = ClientDatasets(build, max_cached=10)
  data.prefetch(['c3', 'c5'])
  first, rejected = data.get(['c3', 'c5', 'c2'])
  assert rejected == {}
  assert [list(ds.as_numpy_iterator()) for ds in first] == [[0, 2, 4], [0, 2, 4, 6, 8], [0, 2]]
  assert sorted(build.calls) == ['c2', 'c3', 'c5']         # Each client built exactly once...
  assert any(t.startswith('client-data-prefetch') for t in build.threads)  # ...c3/c5 in the background.
  again, _ = data.get(['c5', 'c3'])
  assert again[0] is first[1] and again[1] is first[0]      # Served from the cache.
  assert len(build.calls) == 3
  data.close()


def test_lru_eviction_and_no_cache():
  build = _Builder()
  data = ClientDatasets(build, max_cached=2, prefetch=False)
  data.get(['c1', 'c2'])
  data.get(['c1'])            # c1 becomes most recent; c3 evicts c2.
  data.get(['c3'])
  data.get(['c1', 'c2'])
  assert build.calls == ['c1', 'c2', 'c3', 'c2']
  uncached = _Builder()
  off = ClientDatasets(uncached, max_cached=0)
  off.prefetch(['c1'])        # A no-op without a cache.
  off.get(['c1'])
  off.get(['c1'])
  assert uncached.calls == ['c1', 'c1']
  off.close()


@pytest.mark.parametrize('prefetch', [True, False])
def test_a_client_whose_dataset_fn_raises_is_rejected_and_the_others_are_served(prefetch):
  build = _Builder(fail_on='c4')
  data = ClientDatasets(build, max_cached=10, prefetch=prefetch)
  data.prefetch(['c1', 'c4'])
  datasets, rejected = data.get(['c1', 'c4', 'c3'])
  assert rejected == {'c4': 'could not read its data (ValueError: client c4 has no examples)'}
  assert [list(ds.as_numpy_iterator()) for ds in datasets] == [[0], [0, 2, 4]]
  data.close()


def test_a_dataset_that_fails_while_checked_is_rejected_with_the_sqlite_error(tmp_path):
  # TFF's own SqlClientData pastes the id into the SQL text: the quote breaks the query, which
  # fails only when the dataset is read (here by the check).
  protos = [synthetic_data.emnist_example(np.zeros((28, 28)), 1)] * 3
  synthetic_data.write_sqlite(str(tmp_path / 'emnist_all.sqlite'), {
      split: {"o'brien": protos, 'plain': protos} for split in ('all_train', 'all_test')})
  train, _ = tff.simulation.datasets.emnist.load_data(only_digits=False,
                                                      cache_dir=str(tmp_path))
  batch = lambda ds: ds.map(lambda e: (e['pixels'], e['label'])).batch(2)  # noqa: E731
  data = ClientDatasets(lambda cid: batch(train.create_tf_dataset_for_client(cid)),
                        check_fn=lambda ds: check_client_dataset(ds, 10))
  datasets, rejected = data.get(["o'brien", 'plain'])
  assert len(datasets) == 1 and len(list(datasets[0])) == 2
  assert list(rejected) == ["o'brien"]
  assert rejected["o'brien"].startswith('could not read its data (UnknownError: Prepare() '
                                        'failed: [1] near "brien": syntax error')
  data.close()


@pytest.mark.parametrize('x,y,reason', [
    ([[0.5, 1.0], [0.0, 2.0]], [1, 2], None),
    ([[0.5, float('nan')], [0.0, 2.0]], [1, 2], 'NaN or Inf'),
    ([[0.5, float('inf')], [0.0, 2.0]], [1, 2], 'NaN or Inf'),
    ([[0.5, 1.0], [0.0, 2.0]], [1, 10], 'outside [0, 10) (found 10)'),
    ([[0.5, 1.0], [0.0, 2.0]], [-1, 2], 'outside [0, 10) (found -1)'),
])
def test_check_client_dataset(x, y, reason):
  ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(2)
  found = check_client_dataset(ds, max_index=10)
  assert (found is None) if reason is None else (reason in found)


def test_rejected_clients_are_reported_not_trained():
  def build(cid):
    n = 0 if cid == 'empty' else 3
    return tf.data.Dataset.from_tensor_slices(([[1.0]] * n, [0] * n)).batch(2)
  data = ClientDatasets(build, check_fn=lambda ds: check_client_dataset(ds, 2))
  data.prefetch(['a', 'empty'])
  datasets, rejected = data.get(['a', 'empty', 'b'])
  assert len(datasets) == 2 and rejected == {'empty': 'empty dataset'}
  data.close()
