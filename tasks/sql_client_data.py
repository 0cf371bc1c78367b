"""Reads a client's examples from TFF's SQLite caches with a query that is exact for any id.

TFF 0.87's `SqlClientData` pastes the client id into the SQL text
(`... WHERE client_id = '<id>' and split_name = '<split>'`): an id holding `'` makes the query
invalid (the round then fails deep inside TF), and an id such as `x' OR '1'='1` selects other
clients' rows as if they were its own. `safe_client_data` rebuilds the ClientData that
`tff.simulation.datasets.*.load_data` returned over the same file, split, client ids and TFF
proto parsing, but selects a client's rows with a query in which the id appears only as hex
digits: a SQLite blob literal cast to text, `client_id = CAST(X'78272...' AS TEXT)`.

Why not a `?`-parameterized query: `tf.data.experimental.SqlDataset` (what TFF uses) takes a
query string and no parameters, and a `Dataset.from_generator` over Python's sqlite3 (which does
bind parameters) is a PyFunc, which TFF's C++ worker cannot run (it fails with "No registered
'PyFunc' OpKernel": training datasets are serialized into the `worker_binary` process). Hex
digits cannot end the literal whatever the id holds (quotes, NUL, any unicode), so the match is
as exact as a bound parameter, and the dataset stays a graph op the worker can run, for a
Python id and for a traced id tensor (`serializable_dataset_fn`, used by
`create_tf_dataset_from_all_clients`) alike.

Index: TFF's downloaded caches have no index on `examples`, so every client lookup (TFF's query
or ours) scans the table (~0.1 s at 685k rows; the real StackOverflow file has 135M). The caches
we generate (tasks/synthetic_data.py) carry an index on (split_name, client_id), which this
query uses. We never write to a user's downloaded file unasked: the data check warns when it
has no such index, and `python -m tasks.data_files --add_index PATH` adds one.
"""

import sqlite3

import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.datasets import client_data as tff_client_data
from tensorflow_federated.python.simulation.datasets import sql_client_data as tff_sql

# `PRAGMA encoding` -> the encoding TEXT values are stored in (what CAST(blob AS TEXT) assumes).
_SQLITE_ENCODINGS = {'UTF-8': 'UTF-8', 'UTF-16le': 'UTF-16-LE', 'UTF-16be': 'UTF-16-BE'}


def _hex(text: tf.Tensor, encoding: str) -> tf.Tensor:
  """Lowercase hex of scalar UTF-8 tf.string `text` encoded in `encoding`, in graph ops (so it
  also works on a traced id)."""
  if encoding != 'UTF-8':   # TF transcodes to UTF-16-BE only: swap each byte pair for LE.
    text = tf.strings.unicode_transcode(text, 'UTF-8', 'UTF-16-BE', errors='strict')
  raw = tf.cast(tf.io.decode_raw(text, tf.uint8), tf.int32)
  if encoding == 'UTF-16-LE':
    raw = tf.reshape(tf.reverse(tf.reshape(raw, [-1, 2]), axis=[1]), [-1])
  digits = tf.constant([f'{b:02x}' for b in range(256)])
  return tf.strings.reduce_join(tf.gather(digits, raw))


def _text_encoding(path: str) -> str:
  with sqlite3.connect(f'file:{path}?mode=ro', uri=True) as con:
    encoding = con.execute('PRAGMA encoding').fetchone()[0]
  con.close()
  return _SQLITE_ENCODINGS[encoding]   # SQLite has no other text encodings.


class SafeSqlClientData(tff.simulation.datasets.ClientData):
  """TFF's `SqlClientData` (serialized `tf.train.Example` strings per client) with the client
  id bound as a hex blob literal instead of pasted into the SQL text."""

  def __init__(self, database_filepath: str, split_name, client_ids):
    self._filepath = database_filepath
    self._client_ids = client_ids
    self._known = frozenset(client_ids)   # TFF checks membership in the list: O(clients).
    self._encoding = _text_encoding(database_filepath)
    split = ''
    if split_name is not None:
      split = f" AND split_name = CAST(X'{split_name.encode(self._encoding).hex()}' AS TEXT)"
    # ORDER BY rowid is TFF's order (its query scans the table in rowid order); with the
    # (split_name, client_id) index the rows come in rowid order already, so no sort runs.
    self._query_tail = split + ' ORDER BY rowid'

  def query(self, client_id):
    """The SQL text selecting `client_id`'s serialized examples: a str for a str id, else (a
    traced id) a tf.string tensor."""
    head = "SELECT serialized_example_proto FROM examples WHERE client_id = CAST(X'"
    if isinstance(client_id, str):   # The same text, without eager TF ops.
      return f"{head}{client_id.encode(self._encoding).hex()}' AS TEXT){self._query_tail}"
    return tf.strings.join([head, _hex(client_id, self._encoding), "' AS TEXT)",
                            self._query_tail])

  def _create_dataset(self, client_id) -> tf.data.Dataset:
    return tf.data.experimental.SqlDataset(driver_name='sqlite',
                                           data_source_name=self._filepath,
                                           query=self.query(client_id), output_types=tf.string)

  @property
  def serializable_dataset_fn(self):
    return self._create_dataset

  @property
  def client_ids(self):
    return self._client_ids

  def create_tf_dataset_for_client(self, client_id: str) -> tf.data.Dataset:
    if client_id not in self._known:
      raise ValueError(f'ID [{client_id}] is not a client in this ClientData. See property '
                       '`client_ids` for the list of valid ids.')
    return self._create_dataset(client_id)

  @property
  def element_type_structure(self):
    return tf.TensorSpec(shape=(), dtype=tf.string)


def safe_client_data(loaded) -> tff.simulation.datasets.ClientData:
  """`loaded` (what TFF's `load_data` returns: `SqlClientData(...).preprocess(parse_proto)`)
  reading each client through `SafeSqlClientData`: same file, split, client ids (same list)
  and TFF's own proto parsing, hence the same element spec and values."""
  sql = getattr(loaded, '_underlying_client_data', None)
  if not (isinstance(loaded, tff_client_data.PreprocessClientData)
          and isinstance(sql, tff_sql.SqlClientData)):
    raise TypeError(f'expected the SqlClientData.preprocess(...) that TFF 0.87 load_data '
                    f'returns, got {type(loaded).__name__}')
  # pylint: disable=protected-access
  safe = SafeSqlClientData(sql._filepath, sql._split_name, sql.client_ids)
  return safe.preprocess(loaded._preprocess_fn)
