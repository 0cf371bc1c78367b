"""Preprocessed client datasets for the round loop: an LRU cache and one-round-ahead prefetch.

Building a client's `tf.data` pipeline from TFF's SQLite ClientData costs ~25 ms (a SQL query
plus the preprocessing graph), a quarter of an EMNIST round at 10 clients. Samplers are
deterministic in (seed, round), so the loop asks for round r+1's clients while round r runs in
the C++ worker (which releases the GIL), and clients sampled again reuse their cached pipeline.
A cached pipeline is the same object the loop would rebuild (same shuffle seed), so caching
changes no result.

Each client's data is also checked once, when first built (`check_client_dataset`): an empty
dataset, NaN/Inf values or integer labels/tokens outside the model's output range would
otherwise fail deep inside TF in the worker (or poison the update); such a client is rejected
from its rounds with the reason, like a client that dropped out. So is a client whose dataset
cannot be built or read at all (any exception from `dataset_fn` or the check).

`value_fn(client_id, dataset)` picks what an accepted client contributes to the round (and what
is cached): the dataset itself by default; its id when the datasets are built on the workers
(`ExperimentConfig.datasets_on_workers`), where the coordinator still reads each new client
once for the check, so a client is rejected in exactly the same rounds in both modes.
"""

import collections
import concurrent.futures
import re
import threading
from typing import Any, Callable, Hashable, Optional, Sequence

import numpy as np
import tensorflow as tf


def check_client_dataset(dataset: tf.data.Dataset, max_index: Optional[int]) -> Optional[str]:
  """Why `dataset` cannot be trained on, or None if it can.

  Float leaves must be finite; integer leaves (class labels, token ids) must lie in
  [0, max_index) when `max_index` (the model's output dimension) is given.
  """
  count = 0
  for element in dataset:
    leaves = tf.nest.flatten(element)
    count += int(np.shape(leaves[0])[0]) if np.ndim(leaves[0]) else 1
    for leaf in leaves:
      value = np.asarray(leaf)
      if value.dtype.kind == 'f' and not np.all(np.isfinite(value)):
        return 'NaN or Inf in its features or labels'
      if value.dtype.kind in 'iu' and max_index is not None and value.size and (
          value.min() < 0 or value.max() >= max_index):
        return (f'integer labels/tokens outside [0, {max_index}) (found '
                f'{value.min() if value.min() < 0 else value.max()})')
  if count == 0:
    return 'empty dataset'
  return None


def _failure_reason(e: Exception) -> str:
  """One line naming the exception: TF errors carry the op's message (`e.message`, e.g. the
  SQLite error) after a long node prefix in str(e)."""
  message = getattr(e, 'message', None) or str(e)
  lines = [l.strip() for l in str(message).splitlines() if l.strip()]
  first = re.sub(r'^\{\{function_node [^}]*\}\}\s*', '', lines[0]) if lines else ''
  if len(first) > 300:
    first = first[:300] + ' ...'
  return f'could not read its data ({type(e).__name__}{": " + first if first else ""})'


class ClientDatasets:
  """client id -> preprocessed dataset, built by `dataset_fn`, checked, cached and prefetched."""

  def __init__(self, dataset_fn: Callable[[Hashable], Any], max_cached: int = 1000,
               prefetch: bool = True,
               check_fn: Optional[Callable[[Any], Optional[str]]] = None,
               value_fn: Optional[Callable[[Hashable, Any], Any]] = None):
    self._fn = dataset_fn
    self._value = value_fn
    self._check = check_fn
    self._max = max(0, int(max_cached))
    self._cache: collections.OrderedDict = collections.OrderedDict()
    self._lock = threading.Lock()
    self._executor = (concurrent.futures.ThreadPoolExecutor(1, 'client-data-prefetch')
                      if prefetch else None)
    self._pending: Optional[concurrent.futures.Future] = None

  def _lookup(self, cid):
    with self._lock:
      if cid in self._cache:
        self._cache.move_to_end(cid)
        return self._cache[cid]
    return None

  def _make(self, cid):
    """(value, rejection reason or None); the value (the dataset, or `value_fn` of it) is None
    if the dataset could not be built.

    Any exception from `dataset_fn` or `check_fn` (a client id the data source cannot read, an
    unreadable or malformed record) is one client's problem: the client is rejected with the
    reason, like a check failure, and the round goes on without it.
    """
    try:
      ds = self._fn(cid)
      reason = self._check(ds) if self._check is not None else None
    except Exception as e:  # pylint: disable=broad-except
      return None, _failure_reason(e)
    if self._value is not None:
      return (self._value(cid, ds) if reason is None else None), reason
    return ds, reason

  def _build(self, cid):
    """(dataset, rejection reason or None)."""
    entry = self._lookup(cid)
    if entry is None:
      entry = self._make(cid)
      with self._lock:
        self._cache[cid] = entry
        while len(self._cache) > self._max:
          self._cache.popitem(last=False)
    return entry

  def prefetch(self, client_ids: Sequence[Hashable]) -> None:
    """Starts building `client_ids` in the background (no-op without prefetch)."""
    if self._executor is None or self._max == 0:
      return
    self._wait()
    ids = list(client_ids)[:self._max]
    self._pending = self._executor.submit(lambda: [self._build(c) for c in ids])

  def _wait(self) -> None:
    if self._pending is not None:
      pending, self._pending = self._pending, None
      pending.result()  # Re-raises a failure of the background build here.

  def get(self, client_ids: Sequence[Hashable]) -> tuple[list, dict]:
    """(datasets, or `value_fn` values, of the accepted clients in order,
    {rejected client id: reason})."""
    self._wait()
    build = self._make if self._max == 0 else self._build
    datasets, rejected = [], {}
    for cid in client_ids:
      ds, reason = build(cid)
      if reason is None:
        datasets.append(ds)
      else:
        rejected[cid] = reason
    return datasets, rejected

  def close(self) -> None:
    if self._executor is not None:
      try:
        self._wait()
      except Exception:  # pylint: disable=broad-except
        pass  # Only a prefetch for a round that will not run; nothing to report.
      self._executor.shutdown(wait=True)
      self._executor = None
