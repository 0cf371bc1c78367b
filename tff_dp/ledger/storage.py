"""The ledger file: read whole and checked (`read_ledger`), appended to durably
(`PrivacyLedger`), its partial last line moved aside (`repair_truncated_tail`) and its last
records moved to an audit file on resume (`move_records`).
"""

import datetime
import os
from typing import List, Optional, Sequence, Tuple

from tff_dp import atomic_write
from tff_dp.ledger.lines import LineMac
from tff_dp.ledger.lines import check_round_order
from tff_dp.ledger.lines import decode_ledger
from tff_dp.ledger.lines import encode
from tff_dp.ledger.lines import check_seal
from tff_dp.ledger.lines import decode_line
from tff_dp.ledger.lines import write_seal
from tff_dp.ledger.values import LedgerError
from tff_dp.ledger.records import RoundRecord


def _split_complete_lines(data: bytes) -> Tuple[List[bytes], bytes]:
  """Splits file content into complete lines (without newline) and a partial tail."""
  last_nl = data.rfind(b'\n')
  complete, tail = data[:last_nl + 1], data[last_nl + 1:]
  return complete.split(b'\n')[:-1], tail


def _read_bytes(path: str) -> bytes:
  """The content of the ledger file `path`; LedgerError if it is missing or not a file."""
  try:
    with open(path, 'rb') as f:
      return f.read()
  except FileNotFoundError:
    raise LedgerError(f'Ledger file {path} does not exist.') from None
  except IsADirectoryError:
    raise LedgerError(f'Ledger path {path} is a directory, not a ledger file (a run '
                      'directory holds it as ledger.jsonl).') from None
  except OSError as e:
    raise LedgerError(f'Cannot read ledger file {path}: {e.strerror or e}.') from None


def read_ledger(path: str, mac_key: Optional[bytes] = None,
                seal_path: Optional[str] = None) -> List[RoundRecord]:
  """Reads every record of the ledger at `path`, in file order (every line's MAC verified
  under `mac_key` when given, and with `seal_path` the count and chain head checked against
  the seal, `check_seal`).

  Raises LedgerError naming the 1-based line number of the first truncated (no trailing
  newline), edited (checksum mismatch), empty, schema-invalid or out-of-order (deleted,
  duplicated, moved; see the module docstring) line. Nothing is skipped.
  """
  data = _read_bytes(path)
  lines, tail = _split_complete_lines(data)
  records, macs = decode_ledger(lines, path, mac_key)
  if tail:
    raise LedgerError(
        f'{path} line {len(lines) + 1}: truncated line ({len(tail)} bytes, no trailing '
        'newline), probably a crash mid-write: move it aside with `python -m tff_dp.accounting '
        f'--repair {path}` (a resumed run does it itself).')
  if seal_path is not None:
    if mac_key is None:
      raise LedgerError('a ledger\'s seal is checked under its key: give the key too.')
    check_seal(seal_path, mac_key, macs, path)
  return records


def macs_of(path: str) -> List[LineMac]:
  """Each complete line's MAC, unverified: whether a reader without the key is reading a
  ledger it cannot verify, and whether a seal commits to it."""
  lines, _ = _split_complete_lines(_read_bytes(path))
  return decode_ledger(lines, path)[1]


def check_resumable(path: str) -> None:
  """Raises LedgerError if the ledger at `path` (if any) is damaged beyond a partial last
  line, the one damage a resume repairs (`repair_truncated_tail`): checked before a resume
  writes anything, so that a refused resume changes nothing."""
  if os.path.exists(path):
    lines, _ = _split_complete_lines(_read_bytes(path))
    decode_ledger(lines, path)


def read_moved_records(path: str) -> List[RoundRecord]:
  """Reads the records `move_records` set aside in `path` (e.g. ledger.unreleased.jsonl).

  Every line is checksum- and schema-checked, but not the order: the file collects lines
  moved from the end of the ledger at different times, so their seq are not its line numbers.
  This is an audit file, never a ledger to account.
  """
  data = _read_bytes(path)
  lines, tail = _split_complete_lines(data)
  if tail:
    raise LedgerError(f'{path} line {len(lines) + 1}: truncated line ({len(tail)} bytes).')
  return [decode_line(line, i + 1, path)[0] for i, line in enumerate(lines)]


def repair_truncated_tail(path: str) -> Optional[str]:
  """Moves a partial last line to `<path>.corrupt-<UTC timestamp>` and truncates `path`.

  Returns the path of the file holding the removed bytes, or None if the ledger ends with a
  newline (nothing to repair). The partial bytes are written and fsynced before the ledger
  is truncated, so nothing is ever lost. The round whose line was partial was not completed
  (the loop releases outputs only after a durable append) and will be re-executed and
  appended again on resume.
  """
  with open(path, 'rb') as f:
    data = f.read()
  _, tail = _split_complete_lines(data)
  if not tail:
    return None
  stamp = datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%S.%fZ')
  corrupt_path = f'{path}.corrupt-{stamp}'
  suffix = 0
  while os.path.exists(corrupt_path):
    suffix += 1
    corrupt_path = f'{path}.corrupt-{stamp}-{suffix}'
  with open(corrupt_path, 'xb') as f:
    f.write(tail)
    f.flush()
    os.fsync(f.fileno())
  with open(path, 'r+b') as f:
    f.truncate(len(data) - len(tail))
    f.flush()
    os.fsync(f.fileno())
  atomic_write.fsync_dir(os.path.dirname(os.path.abspath(path)))
  return corrupt_path



class PrivacyLedger:
  """Append-only, crash-safe writer for the privacy ledger at `path`.

  Opening validates every existing line, including their order (so appending never extends
  a corrupt ledger), and refuses a ledger whose last line is partial unless `repair=True`,
  which moves the partial line aside with `repair_truncated_tail(path)` (never silently
  dropped). `append` stamps each line with its seq (num_records + 1) and refuses a record
  whose round number would break the order `read_ledger` checks. Use as a context manager
  or call `close()`. With `mac_key` every existing line's MAC is verified and every appended
  line carries a chained one; with `seal_path` too, the existing lines are checked against the
  seal (`check_seal`; a chained ledger without its seal is refused) and the seal is rewritten
  after every append, so a ledger cut short is refused under the key.
  """

  def __init__(self, path: str, repair: bool = False, mac_key: Optional[bytes] = None,
               seal_path: Optional[str] = None):
    if seal_path is not None and mac_key is None:
      raise LedgerError('a ledger seal is written under the ledger\'s key: give `mac_key`.')
    self.path = path
    self.mac_key = mac_key
    self.seal_path = seal_path
    self.repaired_to = None  # Path of the moved partial line, if a repair happened.
    self._fd = None
    self._last_mac = ''
    self._num_records = self._last_round = 0
    created = not os.path.exists(path)
    if not created:
      self._open_existing(repair)
    self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    if created:
      atomic_write.fsync_dir(os.path.dirname(os.path.abspath(path)))
    self._seal()

  def _open_existing(self, repair: bool) -> None:
    """Validates the existing lines (and their seal), moving a partial last line aside when
    `repair`."""
    path = self.path
    lines, tail = _split_complete_lines(_read_bytes(path))
    if tail and not repair:
      raise LedgerError(
          f'{path} line {len(lines) + 1} is a partial line ({len(tail)} bytes, no '
          'trailing newline), probably from a crash mid-write. Refusing to append. '
          'Reopen with repair=True (or call '
          'tff_dp.ledger.repair_truncated_tail) to move it to '
          f'{path}.corrupt-<timestamp>.')
    records, macs = decode_ledger(lines, path, self.mac_key)
    chained = any(m.chained for m in macs)
    if self.seal_path is not None and (chained or os.path.exists(self.seal_path)):
      check_seal(self.seal_path, self.mac_key, macs, path)
    if tail:
      self.repaired_to = repair_truncated_tail(path)
    self._num_records = len(records)
    self._last_round = records[-1].round_num if records else 0
    self._last_mac = macs[-1].value if macs else ''

  def _seal(self) -> None:
    if self.seal_path is not None:
      write_seal(self.seal_path, self.mac_key, self._num_records, self._last_mac)

  @property
  def num_records(self) -> int:
    """Number of records in the ledger (existing plus appended)."""
    return self._num_records

  def append(self, record: RoundRecord) -> None:
    """Durably appends one record (line seq = num_records + 1): one write, then fsync."""
    if self._fd is None:
      raise LedgerError(f'Ledger {self.path} is closed.')
    if not isinstance(record, RoundRecord):
      raise LedgerError(f'append expects a RoundRecord, got {type(record).__name__}.')
    seq = self._num_records + 1
    check_round_order(record.round_num, self._last_round, f'{self.path} line {seq}')
    line, mac = encode(record, seq, self.mac_key, self._last_mac)
    view = memoryview(line)
    while view:  # os.write on a regular file writes everything; loop for safety.
      written = os.write(self._fd, view)
      view = view[written:]
    os.fsync(self._fd)
    self._num_records = seq
    self._last_round = record.round_num
    self._last_mac = mac
    self._seal()

  def close(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> 'PrivacyLedger':
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __del__(self):
    try:
      self.close()
    except Exception:  # pylint: disable=broad-except
      pass


def move_records(path: str, records: Sequence[RoundRecord], moved_path: str,
                 mac_key: Optional[bytes] = None, seal_path: Optional[str] = None) -> None:
  """Moves `records` (which must be the ledger's last lines) from `path` to `moved_path`.

  Used on resume for rounds that released no output before a crash (see
  tff_dp.training.run_state.resume.reconcile_ledger). The moved lines are appended unchanged to
  `moved_path` (fsynced; read it with `read_moved_records`) before the ledger is rewritten
  through a temporary file and an atomic rename, so a crash at any point loses no line. The
  ledger keeps lines 1..k with seq 1..k, so the next append (seq k + 1) continues it. Any
  open PrivacyLedger on `path` must be reopened. With `mac_key` the ledger is verified first
  (and against its seal at `seal_path`), and the seal then commits to the k kept lines.
  """
  all_records = read_ledger(path, mac_key, seal_path)
  keep = len(all_records) - len(records)
  if keep < 0 or tuple(all_records[keep:]) != tuple(records):
    raise LedgerError(f'{path}: can only move the last records of the ledger.')
  with open(path, 'rb') as f:
    lines = f.read().split(b'\n')[:-1]
  with open(moved_path, 'ab') as f:
    f.write(b''.join(line + b'\n' for line in lines[keep:]))
    f.flush()
    os.fsync(f.fileno())
  tmp = f'{path}.tmp-{os.getpid()}'
  with open(tmp, 'wb') as f:
    f.write(b''.join(line + b'\n' for line in lines[:keep]))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  atomic_write.fsync_dir(os.path.dirname(os.path.abspath(path)))
  if seal_path is not None:
    _, macs = decode_ledger(lines[:keep], path, mac_key)
    write_seal(seal_path, mac_key, keep, macs[-1].value if macs else '')
