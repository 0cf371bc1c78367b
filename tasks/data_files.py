"""Checks a TFF dataset cache before TFF's loader touches it (and before it could download).

TFF's `load_data(cache_dir)` downloads when the SQLite file is missing and fails with a deep
sqlite/TF traceback when it is corrupt. We check existence, the SQLite header, integrity, the
two tables and the split names first, and raise one clear UserInputError otherwise.
"""

import os
import sqlite3

from tff_dp.errors import UserInputError

_SQLITE_MAGIC = b'SQLite format 3\x00'
_EXAMPLES_COLUMNS = {'split_name', 'client_id', 'serialized_example_proto'}
_METADATA_COLUMNS = {'client_id', 'split_name', 'num_examples'}
# `PRAGMA quick_check` reads the whole file: 0.7 s for the 344 MB full-population synthetic
# StackOverflow cache at every start, and proportionally longer for TFF's multi-GB real file.
# Above this size only the header, page count, schema and splits are checked; a damaged page is
# then found when a client's rows are read, and the round loop rejects that client with the
# SQLite error (tff_dp/training/client_data.py).
QUICK_CHECK_MAX_BYTES = 256 * 2**20


def check_data_dir(data_dir: str) -> None:
  if not data_dir:
    raise UserInputError('no data directory given (--data_dir)')
  if not os.path.isdir(data_dir):
    raise UserInputError(f'data directory {data_dir} does not exist')


def check_sqlite_file(path: str, required_splits) -> None:
  """Raises UserInputError naming `path` unless it is an intact TFF dataset database."""
  if not os.path.isfile(path):
    raise UserInputError(
        f'{path} not found: put the TFF dataset file there (as downloaded by '
        'tff.simulation.datasets) or omit --data_dir to use the embedded dataset; '
        'no download is attempted')
  with open(path, 'rb') as f:
    header = f.read(100)
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
      splits = {r[0] for r in conn.execute('SELECT DISTINCT split_name FROM client_metadata')}
      missing = [s for s in required_splits if s not in splits]
      if missing:
        raise UserInputError(f'{path} has no split(s) {missing} (found {sorted(splits)})')
    finally:
      conn.close()
  except sqlite3.DatabaseError as e:
    raise UserInputError(f'{path} is corrupt or truncated ({e})') from None
