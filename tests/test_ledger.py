"""Tests for tff_dp.ledger: round trip, float casting, validation, corruption detection, repair,
line order (deleted, duplicated, reordered lines; re-execution after a resume)."""

import glob
import hashlib
import json

import numpy as np
import pytest

from tff_dp import errors
from tff_dp import ledger
from tff_dp.ledger import lines as ledger_lines


def _record(round_num, clip=1.0, stddev=1.2):
  return ledger.RoundRecord(
      round_num, ledger.SamplingEvent('poisson', 1000, probability=0.01),
      (ledger.GaussianSumQuery('update', clip, stddev),
       ledger.GaussianSumQuery('clipped_count', 0.5, 0.25)))


def _write(path, records):
  with ledger.PrivacyLedger(path) as led:
    for r in records:
      led.append(r)


def test_round_trip(tmp_path):
  path = str(tmp_path / 'ledger.jsonl')
  records = [_record(t, clip=0.1 * t) for t in range(1, 6)]
  records.append(ledger.RoundRecord(
      6, ledger.SamplingEvent('fixed_size', 50, sample_size=10),
      (ledger.GaussianSumQuery('update/dense', 2.0, 3.0),)))
  _write(path, records)
  assert ledger.read_ledger(path) == records
  with open(path, 'rb') as f:
    lines = f.read().split(b'\n')
  assert lines[-1] == b'' and len(lines) == 7
  obj = json.loads(lines[0])
  assert obj['schema_version'] == ledger.SCHEMA_VERSION and len(obj['sha256']) == 64


def _correlated_record(round_num, noise):
  return ledger.RoundRecord(
      round_num, ledger.SamplingEvent('min_separation', 40, sample_size=5, epoch=1),
      (ledger.GaussianSumQuery('update', 1.0, 0.9),), None, noise)


def test_a_strategy_is_recorded_by_its_parameters_or_else_its_coefficients(tmp_path):
  """A BLT's buffers, a banded strategy's bands, or another strategy's coefficients: exactly
  one; `coefs` is written only when set, so BLT and banded records keep their lines."""
  strategies = [ledger.CorrelatedNoise('blt', 8, 4, 2, buf_decay=(0.5,), output_scale=(0.3,)),
                ledger.CorrelatedNoise('bandmf', 8, 4, 2, bands=3),
                ledger.CorrelatedNoise('mine', 8, 4, 2, coefs=(1.0, 0.5, 0.25))]
  path = str(tmp_path / 'ledger.jsonl')
  _write(path, [_correlated_record(r, s) for r, s in enumerate(strategies, 1)])
  assert [r.correlated for r in ledger.read_ledger(path)] == strategies
  with open(path) as f:
    written = [json.loads(line)['record']['correlated'] for line in f]
  assert ['coefs' in w for w in written] == [False, False, True]
  assert written[2]['coefs'] == [1.0, 0.5, 0.25]
  for bad in (dict(), dict(bands=3, coefs=(1.0,)),
              dict(buf_decay=(0.5,), output_scale=(0.3,), coefs=(1.0,)), dict(coefs=(0.0, 1.0))):
    with pytest.raises(ledger.LedgerError):
      ledger.CorrelatedNoise('mine', 8, 4, 2, **bad)


def test_numpy_and_tf_like_values_are_stored_as_python_floats(tmp_path):
  query = ledger.GaussianSumQuery('update', np.float32(0.1), np.float32(0.13))
  assert type(query.l2_norm_clip) is float and type(query.noise_stddev) is float
  assert query.l2_norm_clip == float(np.float32(0.1))
  event = ledger.SamplingEvent('fixed_size', np.int64(100), sample_size=np.int32(7))
  assert type(event.population_size) is int and type(event.sample_size) is int
  record = ledger.RoundRecord(np.int64(1), event, [query])
  assert isinstance(record.queries, tuple) and type(record.round_num) is int
  path = str(tmp_path / 'ledger.jsonl')
  _write(path, [record])
  (read,) = ledger.read_ledger(path)
  assert read == record and type(read.queries[0].noise_stddev) is float


@pytest.mark.parametrize('clip, stddev', [
    (float('nan'), 1.0), (1.0, float('inf')), (-1.0, 1.0), (1.0, np.float32(-0.5)),
    (True, 1.0), ('1.0', 1.0), (None, 1.0)])
def test_bad_query_values_rejected(clip, stddev):
  with pytest.raises(ledger.LedgerError):
    ledger.GaussianSumQuery('update', clip, stddev)


def test_ledger_errors_are_user_input_errors():
  assert issubclass(ledger.LedgerError, errors.UserInputError)   # -> one `error:` line, exit 2.


@pytest.mark.parametrize('kwargs', [
    pytest.param(dict(kind='poisson', population_size=10, probability=0.0), id='poisson_q_zero'),
    pytest.param(dict(kind='poisson', population_size=10, probability=1.5),
                 id='poisson_q_above_one'),
    pytest.param(dict(kind='poisson', population_size=10), id='poisson_without_q'),
    pytest.param(dict(kind='poisson', population_size=10, probability=0.1, sample_size=1),
                 id='poisson_with_sample_size'),
    pytest.param(dict(kind='fixed_size', population_size=10, sample_size=11),
                 id='fixed_size_above_population'),
    pytest.param(dict(kind='fixed_size', population_size=10, sample_size=0),
                 id='fixed_size_zero'),
    pytest.param(dict(kind='fixed_size', population_size=10, sample_size=2.0),
                 id='fixed_size_float'),
    pytest.param(dict(kind='uniform', population_size=10, sample_size=2), id='unknown_kind'),
    pytest.param(dict(kind='fixed_size', population_size=0, sample_size=0),
                 id='empty_population'),
])
def test_bad_sampling_rejected(kwargs):
  with pytest.raises(ledger.LedgerError):
    ledger.SamplingEvent(**kwargs)


def test_append_requires_round_record(tmp_path):
  with ledger.PrivacyLedger(str(tmp_path / 'l.jsonl')) as led:
    with pytest.raises(ledger.LedgerError):
      led.append({'round_num': 1})


def test_truncated_tail_detected_refused_and_repaired(tmp_path):
  path = str(tmp_path / 'ledger.jsonl')
  _write(path, [_record(t) for t in (1, 2, 3)])
  with open(path, 'rb') as f:
    data = f.read()
  partial = data[:-20]  # Crash in the middle of writing line 3.
  with open(path, 'wb') as f:
    f.write(partial)
  tail = partial[partial.rfind(b'\n') + 1:]
  with pytest.raises(ledger.LedgerError, match=r'line 3.*truncated'):
    ledger.read_ledger(path)
  with pytest.raises(ledger.LedgerError, match=r'line 3 is a partial line'):
    ledger.PrivacyLedger(path)
  # Refusal changed nothing.
  with open(path, 'rb') as f:
    assert f.read() == partial
  with ledger.PrivacyLedger(path, repair=True) as led:
    assert led.num_records == 2
    moved = glob.glob(path + '.corrupt-*')
    assert moved == [led.repaired_to]
    with open(moved[0], 'rb') as f:
      assert f.read() == tail  # Never silently dropped.
    led.append(_record(3))
  assert [r.round_num for r in ledger.read_ledger(path)] == [1, 2, 3]
  assert ledger.repair_truncated_tail(path) is None  # Nothing left to repair.


def test_edited_line_detected_with_line_number(tmp_path):
  path = str(tmp_path / 'ledger.jsonl')
  _write(path, [_record(t) for t in (1, 2, 3)])
  with open(path, 'rb') as f:
    lines = f.read().split(b'\n')
  assert b'"noise_stddev":1.2' in lines[1]
  lines[1] = lines[1].replace(b'"noise_stddev":1.2', b'"noise_stddev":9.2')
  with open(path, 'wb') as f:
    f.write(b'\n'.join(lines))
  with pytest.raises(ledger.LedgerError, match=r'line 2: checksum mismatch'):
    ledger.read_ledger(path)
  with pytest.raises(ledger.LedgerError, match=r'line 2'):
    ledger.PrivacyLedger(path)  # Never appends to a corrupt ledger.


def _line_with_valid_checksum(record_json, version=ledger.SCHEMA_VERSION, seq=2):
  body = {'record': record_json, 'schema_version': version}
  if version >= 2:
    body['seq'] = seq
  digest = hashlib.sha256(ledger_lines._canonical(body).encode()).hexdigest()
  return (ledger_lines._canonical(dict(body, sha256=digest)) + '\n').encode()


@pytest.mark.parametrize('mutate, message', [
    (lambda r: r.pop('queries'), 'keys'),
    (lambda r: r['queries'][0].update(noise_stddev=-1.0), 'non-negative'),
    (lambda r: r['queries'][0].update(l2_norm_clip='1'), 'JSON number'),
    (lambda r: r.update(round_num=1.0), 'JSON integer'),
    (lambda r: r['sampling'].update(probability=2.0), r'\(0, 1\]'),
])
def test_schema_invalid_line_detected(tmp_path, mutate, message):
  path = str(tmp_path / 'ledger.jsonl')
  _write(path, [_record(1)])
  bad = _record(2).to_json()
  mutate(bad)
  with open(path, 'ab') as f:
    f.write(_line_with_valid_checksum(bad))
  with pytest.raises(ledger.LedgerError, match=r'line 2: .*' + message):
    ledger.read_ledger(path)


def test_wrong_schema_version_and_blank_line(tmp_path):
  path = str(tmp_path / 'ledger.jsonl')
  _write(path, [_record(1)])
  with open(path, 'ab') as f:
    f.write(_line_with_valid_checksum(_record(2).to_json(), version=99))
  with pytest.raises(ledger.LedgerError, match=r'line 2: unsupported schema_version'):
    ledger.read_ledger(path)
  path2 = str(tmp_path / 'ledger2.jsonl')
  _write(path2, [_record(1)])
  with open(path2, 'ab') as f:
    f.write(b'\n')
  with pytest.raises(ledger.LedgerError, match=r'line 2: not valid JSON'):
    ledger.read_ledger(path2)


def test_missing_ledger_is_a_user_error(tmp_path):
  with pytest.raises(errors.UserInputError, match='does not exist'):
    ledger.read_ledger(str(tmp_path / 'nope.jsonl'))


def test_reopen_appends(tmp_path):
  path = str(tmp_path / 'ledger.jsonl')
  _write(path, [_record(1), _record(2)])
  with ledger.PrivacyLedger(path) as led:
    assert led.num_records == 2
    led.append(_record(3))
    assert led.num_records == 3
  assert [r.round_num for r in ledger.read_ledger(path)] == [1, 2, 3]


def _lines(path):
  with open(path, 'rb') as f:
    return f.read().split(b'\n')[:-1]


def _rewrite(path, lines):
  with open(path, 'wb') as f:
    f.write(b''.join(line + b'\n' for line in lines))


# How a ledger of rounds 1..5 is tampered with, and the first line then out of place.
TAMPERINGS = {
    'middle line deleted': (lambda ls: ls[:2] + ls[3:], 3),
    'first line deleted': (lambda ls: ls[1:], 1),
    'line duplicated': (lambda ls: ls[:3] + [ls[2]] + ls[3:], 4),
    'lines swapped': (lambda ls: [ls[0], ls[2], ls[1]] + ls[3:], 2),
    'last line moved first': (lambda ls: ls[-1:] + ls[:-1], 1),
}


@pytest.mark.parametrize('how', sorted(TAMPERINGS))
def test_deleted_duplicated_or_reordered_line_detected(tmp_path, how):
  path = str(tmp_path / 'ledger.jsonl')
  _write(path, [_record(t) for t in range(1, 6)])
  mutate, bad_line = TAMPERINGS[how]
  _rewrite(path, mutate(_lines(path)))
  with pytest.raises(ledger.LedgerError, match=rf'ledger.jsonl line {bad_line}: seq '):
    ledger.read_ledger(path)
  with pytest.raises(ledger.LedgerError, match=rf'line {bad_line}: seq '):
    ledger.PrivacyLedger(path)  # Never appends to it either.


def test_conservative_re_execution_after_resume_reads(tmp_path):
  # What the training loop leaves after a crash with rounds_per_checkpoint > 1: the last
  # checkpoint is of round 3; rounds 4 and 5 were recorded, round 4 released its metrics
  # (it stays counted), round 5 did not (moved aside); rounds 4, 5, 6 then run again.
  path = str(tmp_path / 'ledger.jsonl')
  moved = str(tmp_path / 'ledger.unreleased.jsonl')
  records = [_record(t) for t in range(1, 6)]
  _write(path, records)
  ledger.move_records(path, records[4:], moved)
  with ledger.PrivacyLedger(path) as led:
    assert led.num_records == 4
    for t in (4, 5, 6):
      led.append(_record(t, clip=2.0))
  assert [r.round_num for r in ledger.read_ledger(path)] == [1, 2, 3, 4, 4, 5, 6]
  assert [json.loads(line)['seq'] for line in _lines(path)] == list(range(1, 8))
  assert ledger.read_moved_records(moved) == records[4:]
  with pytest.raises(ledger.LedgerError, match=r'line 1: seq 5'):
    ledger.read_ledger(moved)  # An audit file, not a ledger.
  # The writer refuses a record that skips a round, as read_ledger would refuse the line.
  with ledger.PrivacyLedger(path) as led:
    with pytest.raises(ledger.LedgerError, match=r'line 8: round 8 after round 6'):
      led.append(_record(8))
    assert led.num_records == 7
  assert len(ledger.read_ledger(path)) == 7


@pytest.mark.parametrize('rounds, bad_line, message', [
    ((2, 3), 1, 'round 2 after the start of the ledger'),
    ((1, 2, 4), 3, 'round 4 after round 2'),
])
def test_rounds_that_skip_are_rejected(tmp_path, rounds, bad_line, message):
  path = str(tmp_path / 'ledger.jsonl')
  # Lines with correct seq and checksum, as a buggy writer would produce them.
  _rewrite(path, [_line_with_valid_checksum(_record(t).to_json(), seq=i + 1)[:-1]
                  for i, t in enumerate(rounds)])
  with pytest.raises(ledger.LedgerError, match=rf'line {bad_line}: {message}'):
    ledger.read_ledger(path)


def test_version_1_lines_read_and_checked_by_round_number(tmp_path):
  path = str(tmp_path / 'ledger.jsonl')
  v1 = [_line_with_valid_checksum(_record(t).to_json(), version=1)[:-1] for t in (1, 2, 3)]
  _rewrite(path, v1)
  with ledger.PrivacyLedger(path) as led:  # An old run resumed: version-2 lines follow.
    assert led.num_records == 3
    led.append(_record(4))
  assert [r.round_num for r in ledger.read_ledger(path)] == [1, 2, 3, 4]
  assert [json.loads(line).get('seq') for line in _lines(path)] == [None, None, None, 4]
  # Without seq, a deleted or repeated version-1 line shows in the round numbers.
  for lines, message in [(v1[:1] + v1[2:], 'line 2: round 3 after round 1'),
                         (v1[:2] + v1[1:], 'line 3: round 2 after round 2'),
                         (_lines(path) + v1[2:], 'line 5: a schema_version 1 line after')]:
    _rewrite(path, lines)
    with pytest.raises(ledger.LedgerError, match=message):
      ledger.read_ledger(path)


def test_directory_as_ledger_is_a_user_error(tmp_path):
  for call in (ledger.read_ledger, ledger.PrivacyLedger):
    with pytest.raises(errors.UserInputError, match='is a directory'):
      call(str(tmp_path))
