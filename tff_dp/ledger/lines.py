"""The ledger's line format: a record's canonical JSON with its sequence number, checksum and
chained MAC (`encode_record`, `decode_line`), the order of a ledger's lines, and the seal that
commits to their number and last MAC (`write_seal`, `check_seal`). Specified in the package's
docstring.
"""

import hashlib
import hmac
import json
import os
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from tff_dp import atomic_write
from tff_dp.ledger.values import LedgerError
from tff_dp.ledger.records import READABLE_SCHEMA_VERSIONS
from tff_dp.ledger.records import RoundRecord
from tff_dp.ledger.records import SCHEMA_VERSION
from tff_dp.ledger.values import as_int


def _canonical(obj: Any) -> str:
  return json.dumps(obj, sort_keys=True, separators=(',', ':'), allow_nan=False,
                    ensure_ascii=True)


MAC_KEY_BYTES = 32


def new_mac_key() -> bytes:
  """A new secret key for the ledger's MACs (32 bytes from the OS)."""
  return os.urandom(MAC_KEY_BYTES)


def _mac(key: bytes, canonical_body: str) -> str:
  return hmac.new(key, canonical_body.encode('utf-8'), hashlib.sha256).hexdigest()


class LineMac(NamedTuple):
  """A ledger line's MAC as written ('' for a line without one), and whether it is chained
  (`chain`: over the previous line's MAC too, so a seal commits to it) or a line's own
  (`hmac`, written before chained MACs)."""
  value: str
  chained: bool


def _chain_mac(key: bytes, previous_mac: str, canonical_body: str) -> str:
  """A line's chained MAC: over the previous line's MAC and its own canonical body, so the
  MACs commit to every line before it and to their order."""
  return _mac(key, previous_mac + '\n' + canonical_body)


def encode_record(record: RoundRecord, seq: int, mac_key: Optional[bytes] = None,
                  previous_mac: str = '') -> bytes:
  """Returns the self-validating ledger line (with trailing newline) for `record`.

  `seq` is the 1-based line number the line will have in the ledger (`PrivacyLedger.append`
  stamps it; `read_ledger` rejects a line whose seq differs from its position). With
  `mac_key` the line also carries its chained MAC (`chain`, over `previous_mac`, the MAC of
  the line before it, '' for the first; the module docstring).
  """
  return encode(record, seq, mac_key, previous_mac)[0]


def encode(record: RoundRecord, seq: int, mac_key: Optional[bytes],
            previous_mac: str) -> Tuple[bytes, str]:
  """`encode_record`, with the line's chained MAC ('' without a key) for the next line."""
  seq = as_int(seq, 'seq', 1)
  body = {'record': record.to_json(), 'schema_version': SCHEMA_VERSION, 'seq': seq}
  canonical = _canonical(body)
  line = dict(body, sha256=hashlib.sha256(canonical.encode('utf-8')).hexdigest())
  if mac_key is not None:
    line['chain'] = _chain_mac(mac_key, previous_mac, canonical)
  return (_canonical(line) + '\n').encode('utf-8'), line.get('chain', '')


def decode_line(line: bytes, line_num: int, path: str = '<ledger>',
                mac_key: Optional[bytes] = None,
                previous_mac: str = '') -> Tuple[RoundRecord, Optional[int]]:
  """Parses and verifies one complete ledger line; raises LedgerError naming the line.

  Returns (record, seq), seq None for a version-1 line. Only checksum, MAC (when `mac_key`
  is given; a chained MAC over `previous_mac`) and schema are checked here; the order of
  lines is checked by `read_ledger`.
  """
  record, seq, _ = _decode_line(line, line_num, path, mac_key, previous_mac)
  return record, seq


def _decode_line(line: bytes, line_num: int, path: str, mac_key: Optional[bytes],
                 previous_mac: str) -> Tuple[RoundRecord, Optional[int], LineMac]:
  """`decode_line`, with the line's MAC (for the next line's chain, and the seal)."""
  where = f'{path} line {line_num}'
  try:
    obj = json.loads(line.decode('utf-8'))
  except (UnicodeDecodeError, ValueError) as e:
    raise LedgerError(f'{where}: not valid JSON ({e}); the ledger is corrupt.') from None
  version = obj.get('schema_version') if isinstance(obj, dict) else None
  if (not isinstance(version, int) or isinstance(version, bool)
      or version not in READABLE_SCHEMA_VERSIONS):
    if isinstance(obj, dict) and 'schema_version' in obj:
      raise LedgerError(f'{where}: unsupported schema_version {version!r} (this version reads '
                        f'{", ".join(map(str, READABLE_SCHEMA_VERSIONS))}).')
    raise LedgerError(f'{where}: not a ledger line (expected keys record, schema_version, '
                      'seq, sha256).')
  body_keys = {'record', 'schema_version'} | ({'seq'} if version >= 2 else set())
  macs = set(obj) & {'hmac', 'chain'}
  if set(obj) - macs != body_keys | {'sha256'} or len(macs) > 1:
    raise LedgerError(f'{where}: not a schema_version {version} ledger line (keys '
                      f'{sorted(obj)}, expected {sorted(body_keys | {"sha256"})} and at most '
                      'one MAC).')
  body = {k: obj[k] for k in body_keys}
  try:
    canonical = _canonical(body)
  except ValueError as e:  # NaN/Infinity literals.
    raise LedgerError(f'{where}: invalid value ({e}).') from None
  if hashlib.sha256(canonical.encode('utf-8')).hexdigest() != obj['sha256']:
    raise LedgerError(f'{where}: checksum mismatch; the line was edited or corrupted.')
  mac = obj.get('chain', obj.get('hmac', ''))
  if mac_key is not None:
    # Lines written before chained MACs carry `hmac`, a MAC of the line alone.
    expected = (_chain_mac(mac_key, previous_mac, canonical) if 'chain' in obj
                else _mac(mac_key, canonical))
    if not (isinstance(mac, str) and mac and hmac.compare_digest(mac, expected)):
      raise LedgerError(f'{where}: its MAC is missing or wrong under the given key: the line '
                        'was forged (edited with a recomputed checksum), moved, or the key is '
                        'not this ledger\'s.')
  if not isinstance(mac, str):
    raise LedgerError(f'{where}: its MAC must be a string, got {mac!r}.')
  seq = obj.get('seq')
  if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)):
    raise LedgerError(f'{where}: seq must be a JSON integer, got {seq!r}.')
  try:
    return RoundRecord.from_json(obj['record']), seq, LineMac(mac, 'chain' in obj)
  except LedgerError as e:
    raise LedgerError(f'{where}: {e}') from None


def _after(prev_round: int) -> str:
  return f'round {prev_round}' if prev_round else 'the start of the ledger'


def check_round_order(round_num: int, prev_round: int, where: str) -> None:
  """The rule on round numbers (module docstring): 1 <= round_num <= prev_round + 1."""
  if not 1 <= round_num <= prev_round + 1:
    raise LedgerError(
        f'{where}: round {round_num} after {_after(prev_round)}; rounds must start at 1 and '
        'go up by one (or go back to re-execute a round after a resume), never skip a round.')


def decode_ledger(lines: Sequence[bytes], path: str, mac_key: Optional[bytes] = None
                   ) -> Tuple[List[RoundRecord], List[LineMac]]:
  """Decodes complete ledger lines and checks their order (see the module docstring):
  (records, each line's MAC).

  The one place where a whole ledger is validated: `read_ledger` and `PrivacyLedger` use it.
  """
  records, macs = [], []
  prev_round = 0
  seen_seq = False
  for line_num, line in enumerate(lines, 1):
    record, seq, mac = _decode_line(line, line_num, path, mac_key,
                                    macs[-1].value if macs else '')
    where = f'{path} line {line_num}'
    if seq is None:  # Version 1: no seq, so the rounds themselves must be 1, 2, 3, ...
      if seen_seq:
        raise LedgerError(f'{where}: a schema_version 1 line after schema_version 2 lines; '
                          'lines were moved or inserted.')
      if record.round_num != prev_round + 1:
        raise LedgerError(
            f'{where}: round {record.round_num} after {_after(prev_round)} in a '
            'schema_version 1 ledger, whose rounds must be 1, 2, 3, ...; a line was deleted, '
            'duplicated or moved.')
    else:
      seen_seq = True
      if seq != line_num:
        raise LedgerError(
            f'{where}: seq {seq} (the line number it was written at) differs from its line '
            f'number {line_num}; a line was deleted, duplicated or moved.')
      check_round_order(record.round_num, prev_round, where)
    records.append(record)
    macs.append(mac)
    prev_round = record.round_num
  return records, macs


# The seal (`write_seal`): what a MAC'd ledger's count and chain head are checked against; a
# run keeps it under this name in its secret/, beside the key (`tff_dp.run_format`).
SEAL_FILE = 'ledger_seal'


def _seal_mac(key: bytes, count: int, head: str) -> str:
  return _mac(key, f'tff_dp.ledger seal {count} {head}')


def write_seal(path: str, mac_key: bytes, count: int, head: str) -> None:
  """Durably replaces the seal at `path`: the ledger's number of lines and the chained MAC of
  its last line (`head`), MAC'd under the ledger's key. Kept secret with the key: a ledger cut
  short, or whose lines were removed and re-chained, no longer matches it (`check_seal`).
  Written after each append (through a temporary file and a rename, owner-only)."""
  atomic_write.write_text(path, json.dumps({'records': count, 'head': head,
                                            'mac': _seal_mac(mac_key, count, head)},
                                           sort_keys=True), mode=0o600)
  atomic_write.fsync_dir(os.path.dirname(os.path.abspath(path)))


def check_seal(path: str, mac_key: bytes, macs: Sequence[LineMac], ledger_path: str) -> int:
  """Checks the ledger whose lines' MACs are `macs` against its seal at `path`; returns the
  number of lines the seal commits to. One line more than the seal is accepted (its append
  completed, its seal did not: a crash between them; the line's own MAC still chains to the
  sealed head). LedgerError for a missing or forged seal, a ledger cut short, or lines
  replaced."""
  try:
    with open(path, 'rb') as f:
      seal = json.loads(f.read().decode('utf-8'))
  except FileNotFoundError:
    raise LedgerError(f'{ledger_path}: its seal {path} is missing, so a ledger cut short '
                      'could not be told from a whole one; it is kept in the run\'s secret/ '
                      'beside the ledger key.') from None
  except (OSError, ValueError) as e:
    raise LedgerError(f'{path}: not a ledger seal ({e}).') from None
  count, head = (seal.get('records'), seal.get('head')) if isinstance(seal, dict) else (None,
                                                                                        None)
  if (not isinstance(count, int) or isinstance(count, bool) or not isinstance(head, str)
      or not hmac.compare_digest(str(seal.get('mac')), _seal_mac(mac_key, count, head))):
    raise LedgerError(f'{path}: the seal\'s MAC is wrong under the given key: the seal was '
                      'forged, or the key is not this ledger\'s.')
  if count > len(macs):
    raise LedgerError(f'{ledger_path}: {len(macs)} lines, but its seal commits to {count}: the '
                      'ledger was cut short (its last lines removed).')
  if count < len(macs) - 1 or (macs[count - 1].value if count else '') != head:
    raise LedgerError(f'{ledger_path}: its lines do not end as its seal ({count} lines) says: '
                      'lines were replaced or added.')
  return count
