"""Checks a TFF dataset cache before TFF's loader touches it (and before it could download).

TFF's `load_data(cache_dir)` downloads when the SQLite file is missing and fails with a deep
sqlite/TF traceback when it is corrupt. We check existence, the SQLite header, integrity, the
two tables and the split names first, and raise one clear UserInputError otherwise.
"""

import argparse
import os
import sqlite3
import sys
from typing import Optional

from absl import logging

from tff_dp.errors import UserInputError

_SQLITE_MAGIC = b'SQLite format 3\x00'
_EXAMPLES_COLUMNS = {'split_name', 'client_id', 'serialized_example_proto'}
_METADATA_COLUMNS = {'client_id', 'split_name', 'num_examples'}
# `PRAGMA quick_check` reads the whole file: 0.7 s for the 344 MB full-population synthetic
# StackOverflow cache at every start, and proportionally longer for TFF's multi-GB real file.
# Above this size only the header, page count, schema and splits are checked; a damaged page is
# then found when a client's rows are read, and the round loop rejects that client with the
# SQLite error (tff_dp/training/builders/client_data.py).
QUICK_CHECK_MAX_BYTES = 256 * 2**20


# Each dataset family's SQLite file (the name TFF's `load_data` reads) and the splits its tasks
# read (EMNIST's depend on `only_digits`).
DATABASES = {'emnist': 'emnist_all.sqlite', 'stackoverflow': 'stackoverflow.sqlite'}
STACKOVERFLOW_SPLITS = ('train', 'heldout', 'test')


def required_splits(family: str, only_digits: bool = False) -> tuple:
  if family == 'emnist':
    return ('digits_only_train', 'digits_only_test') if only_digits else ('all_train', 'all_test')
  return STACKOVERFLOW_SPLITS


# The file marking a generated embedded dataset of a family (`synthetic_data`), whole.
EMBEDDED_MARKER = '.tff_dp_embedded_v2_{}'   # v2: StackOverflow test clients are training users.


def client_ids(family: str, data_dir: str, only_digits: bool = False) -> tuple[list, list]:
  """(training, test) client ids of the family's checked SQLite file in `data_dir`, each in the
  order TFF's loader lists them (its `_fetch_client_ids` query); no TensorFlow."""
  path = check_task_data(family, data_dir, only_digits)
  splits = required_splits(family, only_digits)
  conn = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
  try:
    return tuple(
        # TFF's query text, so the same plan lists the ids in the same order; `split` is one
        # of this module's constant names, never user input.
        [r[0] for r in conn.execute(
            f"SELECT DISTINCT client_id FROM client_metadata WHERE split_name = '{split}';")]
        for split in (splits[0], splits[-1]))
  finally:
    conn.close()


def embedded_dir_if_generated(family: str, embedded_data_dir: str) -> Optional[str]:
  """`embedded_data_dir` if the family's embedded dataset is generated there, whole."""
  cache_dir = os.path.expanduser(embedded_data_dir)
  whole = (os.path.exists(os.path.join(cache_dir, EMBEDDED_MARKER.format(family)))
           and os.path.exists(os.path.join(cache_dir, DATABASES[family])))
  return cache_dir if whole else None


def check_task_data(family: str, data_dir: str, only_digits: bool = False) -> str:
  """The family's SQLite file in `data_dir` after checking it is there, intact, and holds the
  splits the task reads (no TensorFlow: the command line checks it before TF loads)."""
  check_data_dir(data_dir)
  path = os.path.join(data_dir, DATABASES[family])
  check_sqlite_file(path, required_splits(family, only_digits))
  return path


def check_data_dir(data_dir: str) -> None:
  if not data_dir:
    raise UserInputError('no data directory given (`data_dir`)')
  if os.path.exists(data_dir) and not os.path.isdir(data_dir):
    raise UserInputError(f'`data_dir` {data_dir} is a file, not a directory (it holds the '
                         'task\'s SQLite files)')
  if not os.path.isdir(data_dir):
    raise UserInputError(f'`data_dir` {data_dir} does not exist')
  if not os.access(data_dir, os.R_OK | os.X_OK):
    raise UserInputError(f'data directory {data_dir} cannot be read (permission denied)')


def check_sqlite_file(path: str, required_splits) -> None:
  """Raises UserInputError naming `path` unless it is an intact TFF dataset database."""
  if os.path.isdir(path):
    raise UserInputError(f'{path} is a directory, not the TFF dataset file')
  if not os.path.isfile(path):
    raise UserInputError(
        f'{path} not found: put the TFF dataset file there (as downloaded by '
        'tff.simulation.datasets) or omit --data_dir to use the embedded dataset; '
        'no download is attempted')
  try:
    with open(path, 'rb') as f:
      header = f.read(100)
  except OSError as e:
    raise UserInputError(f'{path} cannot be read ({e.strerror})') from None
  if len(header) < 100 or not header.startswith(_SQLITE_MAGIC):
    raise UserInputError(f'{path} is not an SQLite database (corrupt or wrong file)')
  # SQLite's header records the database size in pages (offset 28) and page size (offset 16).
  page_size = int.from_bytes(header[16:18], 'big')
  page_size = 65536 if page_size == 1 else page_size
  num_pages = int.from_bytes(header[28:32], 'big')
  if num_pages and os.path.getsize(path) < page_size * num_pages:
    raise UserInputError(f'{path} is truncated ({os.path.getsize(path)} bytes, header says '
                         f'{page_size * num_pages}); re-download or regenerate it')
  try:
    conn = sqlite3.connect(f'file:{path}?mode=ro', uri=True)
    try:
      if os.path.getsize(path) <= QUICK_CHECK_MAX_BYTES:
        check = conn.execute('PRAGMA quick_check').fetchone()[0]
        if check != 'ok':
          raise UserInputError(f'{path} is corrupt (sqlite quick_check: {check})')
      tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
      for table, columns in (('examples', _EXAMPLES_COLUMNS),
                             ('client_metadata', _METADATA_COLUMNS)):
        if table not in tables:
          raise UserInputError(f'{path} has no table {table!r}: not a TFF dataset file')
        have = {r[1] for r in conn.execute(f'PRAGMA table_info({table})')}
        if not columns <= have:
          raise UserInputError(f'{path}: table {table} lacks columns {sorted(columns - have)}')
      if not has_client_index(conn):
        logging.warning(
            '%s has no index on examples(split_name, client_id): every client read scans the '
            'whole table (560 ms per client at 1.17M rows, measured), twice per sampled client '
            'per round. Add one once with `python -m tasks.data_files --add_index %s`.',
            path, path)
      splits = {r[0] for r in conn.execute('SELECT DISTINCT split_name FROM client_metadata')}
      missing = [s for s in required_splits if s not in splits]
      if missing:
        raise UserInputError(f'{path} has no split(s) {missing} (found {sorted(splits)})')
    finally:
      conn.close()
  except sqlite3.DatabaseError as e:
    raise UserInputError(f'{path} is corrupt or truncated ({e})') from None


INDEX_NAME = 'examples_split_client'


def has_client_index(conn: sqlite3.Connection) -> bool:
  """Whether `examples` has an index starting with (split_name, client_id)."""
  for row in conn.execute('PRAGMA index_list(examples)'):
    columns = [r[2] for r in conn.execute(f"PRAGMA index_info('{row[1]}')")]
    if columns[:2] == ['split_name', 'client_id']:
      return True
  return False


def add_client_index(path: str) -> bool:
  """Adds the (split_name, client_id) index our generated caches carry to a TFF dataset file
  (e.g. one TFF downloaded), unless it has one; returns whether it added it.

  Only run on request (it writes to the file; TFF's loader reads the file unchanged either way).
  """
  check_sqlite_file(path, ())
  conn = sqlite3.connect(path)
  try:
    if has_client_index(conn):
      return False
    conn.execute(f'CREATE INDEX {INDEX_NAME} ON examples (split_name, client_id)')
    conn.commit()
    return True
  finally:
    conn.close()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m tasks.data_files',
      description='Check a TFF dataset file; --add_index makes per-client reads use an index.')
  parser.add_argument('path')
  parser.add_argument('--add_index', action='store_true',
                      help='add an index on examples(split_name, client_id) (writes the file)')
  args = parser.parse_args(argv)
  try:
    if args.add_index:
      added = add_client_index(args.path)
      print(f'{args.path}: ' + ('index added' if added else 'already indexed'))
    else:
      check_sqlite_file(args.path, ())
      print(f'{args.path}: ok')
  except UserInputError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
