"""The sealed ledger and its replay (issue 50, items 2 and 4): chained MACs and a seal that
commits to the count, refused when cut short or reordered under the key, labelled unverified
without it; the replay CLI prints the run's headline (seeded, fixed-size, amplified), each
checked against dp_accounting built here."""

import hashlib
import json
import math
import re

import dp_accounting
import pytest

from tff_dp import ledger as ledger_lib
from tff_dp import sampling
from tff_dp.accounting import __main__ as cli

DELTA = 1e-5


def _record(r, event, stddev=1.0):
  return ledger_lib.RoundRecord(r, event, (ledger_lib.GaussianSumQuery('update', 1.0, stddev),))


def _sealed_run(tmp_path, event, rounds=4, stddev=1.0):
  """A run directory's ledger.jsonl and secret/ledger_key, secret/ledger_seal."""
  secret = tmp_path / 'secret'
  secret.mkdir()
  key = ledger_lib.new_mac_key()
  sampling.save_key(str(secret / 'ledger_key'), key)
  path = tmp_path / 'ledger.jsonl'
  with ledger_lib.PrivacyLedger(str(path), mac_key=key,
                                seal_path=str(secret / ledger_lib.SEAL_FILE)) as ledger:
    for r in range(1, rounds + 1):
      ledger.append(_record(r, event, stddev))
  return path, secret / 'ledger_key', key


def _rewrite(path, lines):
  path.write_text('\n'.join(lines) + '\n')


def _with_checksum(obj):
  body = {k: obj[k] for k in ('record', 'schema_version', 'seq')}
  obj['sha256'] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(',', ':'))
                                 .encode()).hexdigest()
  return json.dumps(obj, sort_keys=True, separators=(',', ':'))


def _replay(capsys, *args):
  code = cli.main(['prog', *args, f'--delta={DELTA}'])
  out = capsys.readouterr()
  return code, out.out, out.err


def _headline(out):
  line = next(l for l in out.splitlines() if l.startswith('# headline:'))
  return {m: float(v) for m, v in re.findall(r'epsilon_(\w+)=([0-9.e+-]+)', line)}, line


POISSON = ledger_lib.SamplingEvent('poisson', 1000, probability=0.01)


def test_a_ledger_cut_short_is_refused_under_its_key(tmp_path, capsys):
  path, key_path, key = _sealed_run(tmp_path, POISSON)
  lines = path.read_text().splitlines()
  _rewrite(path, lines[:2])   # The last two rounds removed: a smaller epsilon.
  assert len(ledger_lib.read_ledger(str(path))) == 2   # Checksums alone cannot tell.
  with pytest.raises(ledger_lib.LedgerError, match='2 lines, but its seal commits to 4'):
    ledger_lib.read_ledger(str(path), key, str(tmp_path / 'secret' / 'ledger_seal'))
  code, _, err = _replay(capsys, f'--ledger={path}', f'--ledger_key={key_path}')
  assert code == 2 and 'cut short' in err, err
  # The whole ledger replays under its key; its seal missing is refused, never ignored.
  _rewrite(path, lines)
  assert _replay(capsys, f'--ledger={path}', f'--ledger_key={key_path}')[0] == 0
  (tmp_path / 'secret' / 'ledger_seal').unlink()
  code, _, err = _replay(capsys, f'--ledger={path}', f'--ledger_key={key_path}')
  assert code == 2 and 'seal' in err and 'missing' in err, err


def test_reordered_lines_with_their_seq_and_checksums_recomputed_are_refused(tmp_path):
  """Rounds 1, 2, 2 (re-executed after a resume), 3: swapping the two records of round 2, their
  seq and checksums recomputed, keeps every per-line check; the chain refuses it."""
  key = ledger_lib.new_mac_key()
  path = tmp_path / 'ledger.jsonl'
  with ledger_lib.PrivacyLedger(str(path), mac_key=key) as ledger:
    for r, stddev in ((1, 1.0), (2, 1.0), (2, 5.0), (3, 1.0)):
      ledger.append(_record(r, POISSON, stddev))
  lines = path.read_text().splitlines()
  second, third = json.loads(lines[1]), json.loads(lines[2])
  second['seq'], third['seq'] = 3, 2
  _rewrite(path, [lines[0], _with_checksum(third), _with_checksum(second), lines[3]])
  assert [r.queries[0].noise_stddev for r in ledger_lib.read_ledger(str(path))] == [1, 5, 1, 1]
  with pytest.raises(ledger_lib.LedgerError, match='line 2: its MAC is missing or wrong'):
    ledger_lib.read_ledger(str(path), key)


def test_a_forged_ledger_replayed_without_its_key_is_labelled_unverified(tmp_path, capsys):
  path, key_path, _ = _sealed_run(tmp_path, POISSON)
  lines = path.read_text().splitlines()
  forged = [json.loads(line) for line in lines]
  for obj in forged:
    obj['record']['queries'][0]['noise_stddev'] = 10.0   # Ten times the noise.
  _rewrite(path, [_with_checksum(obj) for obj in forged])
  code, out, err = _replay(capsys, f'--ledger={path}')
  assert code == 0
  assert out.splitlines()[0].startswith('# UNVERIFIED') and '[unverified]' in out
  assert 'warning: UNVERIFIED' in err and '--ledger_key' in err
  code, _, err = _replay(capsys, f'--ledger={path}', f'--ledger_key={key_path}')
  assert code == 2 and 'MAC is missing or wrong' in err


def test_the_replay_prints_the_runs_headline(tmp_path, capsys):
  """Seeded Poisson: the epsilon against the seed holder (4 known releases are one Gaussian of
  z / 2); fixed-size: the proven replace-one bound of sampling without replacement; secret
  Poisson: the amplified epsilon. dp_accounting built here for each."""
  def epsilon(event, count=1, relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE):
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    return acc.compose(event, count).get_epsilon(DELTA)

  cases = [
      ('seeded', ledger_lib.SamplingEvent('poisson', 1000, probability=0.01, seeded=True),
       epsilon(dp_accounting.GaussianDpEvent(1.0 / math.sqrt(4))), 'seed'),
      ('fixed', ledger_lib.SamplingEvent('fixed_size', 1000, sample_size=10),
       epsilon(dp_accounting.SampledWithoutReplacementDpEvent(
           1000, 10, dp_accounting.GaussianDpEvent(0.5)), 4,
               dp_accounting.NeighboringRelation.REPLACE_ONE), 'fixed-size'),
      ('secret', POISSON, epsilon(dp_accounting.PoissonSampledDpEvent(
          0.01, dp_accounting.GaussianDpEvent(1.0)), 4), 'amplified'),
  ]
  for name, event, expected, label in cases:
    (tmp_path / name).mkdir()
    path, key_path, _ = _sealed_run(tmp_path / name, event)
    code, out, _ = _replay(capsys, f'--ledger={path}', f'--ledger_key={key_path}',
                           '--method=rdp')
    assert code == 0
    found, line = _headline(out)
    assert found['rdp'] == pytest.approx(expected, rel=1e-6), (name, line)
    assert label in line, line
    assert 'round,epsilon_rdp,epsilon_pld' in out.splitlines()
  # Replace-one with both methods: RDP alone, said so (no longer an error).
  code, out, _ = _replay(capsys, f'--ledger={tmp_path / "fixed" / "ledger.jsonl"}',
                         f'--ledger_key={tmp_path / "fixed" / "secret" / "ledger_key"}',
                         '--neighboring=replace_one')
  assert code == 0 and 'RDP only' in out
