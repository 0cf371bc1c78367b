# Longer than 350 lines: the ledger's record types, their JSON form, the checksummed line
# format and its repair are one file format, kept in one module so that it has one home.
"""Append-only JSONL privacy ledger (McMahan & Andrew 2018, section 5).

Each round appends one line recording the sampling event and every Gaussian sum query
(privacy tuple (S_g, sigma_g)) actually executed that round (none if no client trained). The
accountant (`tff_dp.accounting`) processes the ledger post hoc, so bugs in hyperparameter
code cannot change the reported epsilon.

Line format (one JSON object per line, keys sorted, no spaces), schema version 2:

  {"record": {...}, "schema_version": 2, "seq": <n>, "sha256": "<hex>"}

where `seq` is the 1-based number of the line in the ledger (stamped by `PrivacyLedger`, not
part of `RoundRecord`) and `sha256` the SHA-256 of the canonical JSON of `{"record": ...,
"schema_version": 2, "seq": n}`. Floats are written as the shortest repr that reads back as
the same float64 (float32 values from TF are stored as their exact float64 value).
Version-1 lines (no `seq`) are still read. The checksums detect accidents (a truncated, edited
or reordered line), not forgery: anyone who can write the file can recompute them. Against
forgery a run also writes `"chain": "<hex>"`, HMAC-SHA256 under a secret key the run keeps in
secret/ledger_key (`new_mac_key`) of the previous line's MAC ('' for the first) and the same
canonical body, so the MACs commit to every earlier line and their order; and after every
append a seal (`write_seal`, secret/ledger_seal) that commits to the number of lines and the
last MAC. A reader given the key (`read_ledger(path, mac_key=..., seal_path=...)`,
`python -m tff_dp.accounting --ledger_key`) refuses a line whose MAC is missing or wrong (an
edited, moved or spliced line with a recomputed checksum) and a ledger cut short. Lines
written before chained MACs carry `"hmac"`, a MAC of the line alone, still verified.

Each line is written with a single `os.write` on an O_APPEND descriptor followed by `fsync`,
so a crash can at worst leave one partial last line (no trailing newline). Readers never skip
anything: a partial, edited or schema-invalid line raises `LedgerError` naming its line number.

Order (checked by `read_ledger` and when `PrivacyLedger` opens a ledger, so every reader of a
whole ledger goes through it): each version-2 line's `seq` equals its line number, so a
deleted, duplicated or reordered line is an error naming the first line out of place (a
deleted LAST line is indistinguishable from a crash before the append). Round numbers start
at 1 and each record's round is at most the previous record's round + 1: the next round, or
(after a resume, see tff_dp.training.run_state.resume.reconcile_ledger) a round re-executed after a
crash, whose second record is counted again: as a fresh sample with secret sampling, as the
same sample released twice with a seeded one (`SamplingEvent.seeded`). Version-1 lines carry no `seq`,
so their rounds must be exactly 1, 2, 3, ... and they cannot follow version-2 lines.
"""

import dataclasses
import datetime
import hashlib
import hmac
import json
import math
import operator
import os
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from tff_dp import atomic_write
from tff_dp import choices
from tff_dp import errors

SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
SAMPLING_KINDS = tuple(choices.CLIENT_SAMPLERS)
# Sampling kinds whose events carry an epoch (the permutation's epoch, or cycle).
_WITH_EPOCH = choices.PERMUTATION_SAMPLERS
_WITH_PROBABILITY = ('poisson', 'cyclic_poisson')


class LedgerError(errors.UserInputError):
  """The ledger file or a record is invalid (truncated, edited, bad schema or bad value)."""


def _as_float(value: Any, what: str, allow_zero: bool = True) -> float:
  """Casts numpy/TF/Python scalars to a finite non-negative Python float.

  dp_accounting only treats Python `float` as a number (np.float32 is silently mishandled
  when composing Gaussians), so every stored value is a plain float.
  """
  if isinstance(value, (bool, str, bytes)):
    raise LedgerError(f'{what} must be a number, got {type(value).__name__} {value!r}.')
  if hasattr(value, 'numpy'):  # Eager TF tensor.
    value = value.numpy()
  try:
    result = float(value)
  except (TypeError, ValueError):
    raise LedgerError(f'{what} must be a number, got {type(value).__name__} {value!r}.')
  if not math.isfinite(result):
    raise LedgerError(f'{what} must be finite, got {result!r}.')
  if result < 0 or (not allow_zero and result == 0):
    bound = 'positive' if not allow_zero else 'non-negative'
    raise LedgerError(f'{what} must be {bound}, got {result!r}.')
  return result


def _as_int(value: Any, what: str, minimum: int) -> int:
  """Casts numpy/Python integers to a Python int >= minimum (bools and floats rejected)."""
  if isinstance(value, bool):
    raise LedgerError(f'{what} must be an integer, got bool {value!r}.')
  if hasattr(value, 'numpy'):
    value = value.numpy()
  try:
    result = operator.index(value)
  except TypeError:
    raise LedgerError(f'{what} must be an integer, got {type(value).__name__} {value!r}.')
  if result < minimum:
    raise LedgerError(f'{what} must be >= {minimum}, got {result}.')
  return int(result)


@dataclasses.dataclass(frozen=True)
class SamplingEvent:
  """How this round's records (clients) were selected from the population.

  kind='poisson': each of `population_size` clients independently with `probability`
  (`sample_size` must be None). kind='fixed_size': a uniformly random subset of exactly
  `sample_size` clients without replacement (`probability` must be None).
  kind='shuffled': the next block of `sample_size` clients of epoch `epoch`'s secret
  permutation of the population (each client at most once per epoch; `probability` None).
  kind='min_separation': the next block of `sample_size` clients of one secret permutation,
  its blocks visited cyclically (`epoch`: the cycle), so a client participates every
  population_size // sample_size rounds.
  kind='cyclic_poisson': the population secretly partitioned into `groups` groups visited
  cyclically (`epoch`: the cycle); in its group's round each client independently with
  `probability` (`sample_size` None), so a client is sampled at most once per cycle.
  `epoch` is set for these three kinds only (and only then written to JSON); `groups` for
  cyclic_poisson only.
  `seeded`: the sample is a function of a sampling seed (reproducible, so a re-executed round
  draws the same clients again: the accountant composes both executions as one sample released
  twice); written to JSON only when true.
  `probability_given`: the Poisson kinds' `probability` was an input of the run, fixed before
  the data was seen and used whatever the population (so add/remove neighbours run with the
  same q); false when it was derived from the population (q = m / N, or m x groups / N), so
  a neighbour with one client more or fewer would run with another q and only zero-out
  holds (`tff_dp.accounting.claims`). Written to JSON only when true, so ledgers written before
  it read as derived.
  """
  kind: str
  population_size: int
  probability: Optional[float] = None
  sample_size: Optional[int] = None
  epoch: Optional[int] = None
  seeded: bool = False
  groups: Optional[int] = None
  probability_given: bool = False

  def __post_init__(self):
    if self.kind not in SAMPLING_KINDS:
      raise LedgerError(f'SamplingEvent.kind must be one of {SAMPLING_KINDS}, got {self.kind!r}.')
    n = _as_int(self.population_size, 'SamplingEvent.population_size', 1)
    object.__setattr__(self, 'population_size', n)
    if self.kind in _WITH_PROBABILITY:
      if self.probability is None or self.sample_size is not None:
        raise LedgerError(f'A {self.kind} SamplingEvent needs probability and no sample_size.')
      q = _as_float(self.probability, 'SamplingEvent.probability', allow_zero=False)
      if q > 1:
        raise LedgerError(f'SamplingEvent.probability must be in (0, 1], got {q!r}.')
      object.__setattr__(self, 'probability', q)
    else:
      if self.sample_size is None or self.probability is not None:
        raise LedgerError(f'A {self.kind} SamplingEvent needs sample_size and no probability.')
      m = _as_int(self.sample_size, 'SamplingEvent.sample_size', 1)
      if m > n:
        raise LedgerError(
            f'SamplingEvent.sample_size ({m}) exceeds population_size ({n}).')
      object.__setattr__(self, 'sample_size', m)
    if self.kind in _WITH_EPOCH:
      object.__setattr__(self, 'epoch', _as_int(self.epoch, 'SamplingEvent.epoch', 1))
    elif self.epoch is not None:
      raise LedgerError(f'A {self.kind} SamplingEvent has no epoch, got {self.epoch!r}.')
    if self.kind == 'cyclic_poisson':
      object.__setattr__(self, 'groups', _as_int(self.groups, 'SamplingEvent.groups', 1))
    elif self.groups is not None:
      raise LedgerError(f'A {self.kind} SamplingEvent has no groups, got {self.groups!r}.')
    if not isinstance(self.seeded, bool):
      raise LedgerError(f'SamplingEvent.seeded must be true or false, got {self.seeded!r}.')
    if not isinstance(self.probability_given, bool):
      raise LedgerError(f'SamplingEvent.probability_given must be true or false, got '
                        f'{self.probability_given!r}.')
    if self.probability_given and self.kind not in _WITH_PROBABILITY:
      raise LedgerError(f'A {self.kind} SamplingEvent has no probability to be given.')

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    if self.kind not in _WITH_EPOCH:
      del out['epoch']   # Lines written before shuffled sampling existed stay the same.
    if not self.seeded:
      del out['seeded']   # Likewise for secret samples.
    if self.kind != 'cyclic_poisson':
      del out['groups']
    if not self.probability_given:
      del out['probability_given']   # Ledgers written before it read the same.
    return out


@dataclasses.dataclass(frozen=True)
class GaussianSumQuery:
  """Privacy tuple of one Gaussian sum query run this round.

  `l2_norm_clip` is the L2 bound S_g on each record's contribution, `noise_stddev` the stddev
  sigma_g of the noise added to the sum (before normalisation by clients per round).
  """
  name: str
  l2_norm_clip: float
  noise_stddev: float

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise LedgerError(f'GaussianSumQuery.name must be a non-empty str, got {self.name!r}.')
    object.__setattr__(self, 'l2_norm_clip',
                       _as_float(self.l2_norm_clip, f'query {self.name!r} l2_norm_clip'))
    object.__setattr__(self, 'noise_stddev',
                       _as_float(self.noise_stddev, f'query {self.name!r} noise_stddev'))

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CorrelatedNoise:
  """The strategy a correlated-noise round's noise came from (`dp=blt|bandmf`), as planned for
  the whole run, and the participation schedule it is accounted under: the mechanism that built
  it, and the strategy's parameters, which alone define its coefficients: a BLT's `buf_decay`
  and `output_scale` (coefficients 1, sum_i output_scale_i buf_decay_i^(k-1), ...), a banded
  one's `bands` (the column-normalized banded square root), or, for any other strategy, its
  Toeplitz `coefs` themselves (the first ones; the rest are 0). Built for `rounds` rounds,
  each client at most `max_participations` times, at least `min_separation` rounds apart.
  The queries' `noise_stddev` is then the stddev of each round's fresh Gaussian draw.

  `coefs` is written only when set, so records of BLT and banded strategies read as before."""
  mechanism: str
  rounds: int
  min_separation: int
  max_participations: int
  buf_decay: Tuple[float, ...] = ()
  output_scale: Tuple[float, ...] = ()
  bands: Optional[int] = None
  coefs: Tuple[float, ...] = ()

  def __post_init__(self):
    if not isinstance(self.mechanism, str) or not self.mechanism:
      raise LedgerError(f'CorrelatedNoise.mechanism must name the mechanism, got '
                        f'{self.mechanism!r}.')
    for name in ('rounds', 'min_separation', 'max_participations'):
      object.__setattr__(self, name, _as_int(getattr(self, name), f'CorrelatedNoise.{name}', 1))
    object.__setattr__(self, 'buf_decay', tuple(
        _as_float(v, 'CorrelatedNoise.buf_decay') for v in self.buf_decay))
    object.__setattr__(self, 'output_scale', tuple(
        _as_float(v, 'CorrelatedNoise.output_scale') for v in self.output_scale))
    if len(self.buf_decay) != len(self.output_scale):
      raise LedgerError('CorrelatedNoise.buf_decay and output_scale differ in length.')
    object.__setattr__(self, 'coefs', tuple(
        _as_float(v, 'CorrelatedNoise.coefs') for v in self.coefs))
    if [self.bands is not None, bool(self.buf_decay), bool(self.coefs)].count(True) != 1:
      raise LedgerError('CorrelatedNoise records one strategy: a banded one\'s `bands`, a '
                        'BLT\'s `buf_decay` and `output_scale`, or another\'s `coefs`.')
    if self.coefs and self.coefs[0] <= 0:
      raise LedgerError(f'CorrelatedNoise.coefs must start with a positive coefficient, got '
                        f'{self.coefs[0]}.')
    if self.bands is not None:
      object.__setattr__(self, 'bands', _as_int(self.bands, 'CorrelatedNoise.bands', 1))

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    out['buf_decay'], out['output_scale'] = list(self.buf_decay), list(self.output_scale)
    if self.coefs:
      out['coefs'] = list(self.coefs)
    else:
      del out['coefs']
    return out


@dataclasses.dataclass(frozen=True)
class RoundRecord:
  """One sampling event plus the Gaussian sum queries run on that sample.

  `tree_leaf` (tree-aggregation noise, DP-FTRL): the round's 1-based position in its noise
  tree (1: the round starts a new tree). The queries' `noise_stddev` is then the stddev of the
  noise of each tree node. None (not written to JSON) for independent Gaussian noise.
  `correlated`: the strategy of correlated noise (`dp=blt|bandmf`), else None (not written).
  """
  round_num: int
  sampling: SamplingEvent
  queries: Tuple[GaussianSumQuery, ...]
  tree_leaf: Optional[int] = None
  correlated: Optional[CorrelatedNoise] = None

  def __post_init__(self):
    object.__setattr__(self, 'round_num', _as_int(self.round_num, 'RoundRecord.round_num', 0))
    if self.tree_leaf is not None:
      object.__setattr__(self, 'tree_leaf', _as_int(self.tree_leaf, 'RoundRecord.tree_leaf', 1))
    if self.correlated is not None and not isinstance(self.correlated, CorrelatedNoise):
      raise LedgerError(f'RoundRecord.correlated must be a CorrelatedNoise, got '
                        f'{self.correlated!r}.')
    if not isinstance(self.sampling, SamplingEvent):
      raise LedgerError(f'RoundRecord.sampling must be a SamplingEvent, got {self.sampling!r}.')
    queries = tuple(self.queries)
    for q in queries:
      if not isinstance(q, GaussianSumQuery):
        raise LedgerError(f'RoundRecord.queries must hold GaussianSumQuery, got {q!r}.')
    object.__setattr__(self, 'queries', queries)

  def to_json(self) -> dict:
    out = {
        'round_num': self.round_num,
        'sampling': self.sampling.to_json(),
        'queries': [q.to_json() for q in self.queries],
    }
    if self.tree_leaf is not None:
      out['tree_leaf'] = self.tree_leaf
    if self.correlated is not None:
      out['correlated'] = self.correlated.to_json()
    return out

  @classmethod
  def from_json(cls, obj: Any) -> 'RoundRecord':
    """Strict inverse of `to_json`: exact key sets, JSON types, then value validation."""
    tree = isinstance(obj, dict) and 'tree_leaf' in obj
    correlated = isinstance(obj, dict) and 'correlated' in obj
    _check_keys(obj, {'round_num', 'sampling', 'queries'} | ({'tree_leaf'} if tree else set())
                | ({'correlated'} if correlated else set()), 'record')
    if correlated:
      fields = {f.name for f in dataclasses.fields(CorrelatedNoise)}
      _check_keys(obj['correlated'], fields if 'coefs' in obj['correlated'] else
                  fields - {'coefs'}, 'correlated')
    s = obj['sampling']
    shuffled = isinstance(s, dict) and s.get('kind') in _WITH_EPOCH
    seeded = isinstance(s, dict) and 'seeded' in s
    given = isinstance(s, dict) and 'probability_given' in s
    cyclic = isinstance(s, dict) and s.get('kind') == 'cyclic_poisson'
    _check_keys(s, {'kind', 'population_size', 'probability', 'sample_size'}
                | ({'epoch'} if shuffled else set()) | ({'seeded'} if seeded else set())
                | ({'groups'} if cyclic else set())
                | ({'probability_given'} if given else set()), 'sampling')
    for name, present in (('seeded', seeded), ('probability_given', given)):
      if present and s[name] is not True:
        raise LedgerError(f'sampling.{name} is written only as true, got {s[name]!r}.')
    if not isinstance(obj['queries'], list):
      raise LedgerError('record.queries must be a list.')
    integers = [('round_num', obj['round_num']), ('population_size', s['population_size'])]
    integers += [('tree_leaf', obj['tree_leaf'])] if tree else []
    integers += [('epoch', s['epoch'])] if shuffled else []
    integers += [('groups', s['groups'])] if cyclic else []
    for name, v in integers:
      if not isinstance(v, int) or isinstance(v, bool):
        raise LedgerError(f'{name} must be a JSON integer, got {v!r}.')
    if s['sample_size'] is not None and (
        not isinstance(s['sample_size'], int) or isinstance(s['sample_size'], bool)):
      raise LedgerError(f'sample_size must be a JSON integer or null, got {s["sample_size"]!r}.')
    if s['probability'] is not None:
      _check_json_number(s['probability'], 'probability')
    queries = []
    for q in obj['queries']:
      _check_keys(q, {'name', 'l2_norm_clip', 'noise_stddev'}, 'query')
      _check_json_number(q['l2_norm_clip'], 'l2_norm_clip')
      _check_json_number(q['noise_stddev'], 'noise_stddev')
      queries.append(GaussianSumQuery(q['name'], q['l2_norm_clip'], q['noise_stddev']))
    return cls(obj['round_num'], SamplingEvent(**s), tuple(queries), obj.get('tree_leaf'),
               CorrelatedNoise(**obj['correlated']) if correlated else None)


def _check_keys(obj: Any, keys: set, what: str) -> None:
  if not isinstance(obj, dict):
    raise LedgerError(f'{what} must be a JSON object, got {type(obj).__name__}.')
  if set(obj) != keys:
    raise LedgerError(f'{what} has keys {sorted(obj)}, expected {sorted(keys)}.')


def _check_json_number(v: Any, what: str) -> None:
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    raise LedgerError(f'{what} must be a JSON number, got {v!r}.')


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
  return _encode(record, seq, mac_key, previous_mac)[0]


def _encode(record: RoundRecord, seq: int, mac_key: Optional[bytes],
            previous_mac: str) -> Tuple[bytes, str]:
  """`encode_record`, with the line's chained MAC ('' without a key) for the next line."""
  seq = _as_int(seq, 'seq', 1)
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


def _check_round_order(round_num: int, prev_round: int, where: str) -> None:
  """The rule on round numbers (module docstring): 1 <= round_num <= prev_round + 1."""
  if not 1 <= round_num <= prev_round + 1:
    raise LedgerError(
        f'{where}: round {round_num} after {_after(prev_round)}; rounds must start at 1 and '
        'go up by one (or go back to re-execute a round after a resume), never skip a round.')


def _decode_ledger(lines: Sequence[bytes], path: str, mac_key: Optional[bytes] = None
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
      _check_round_order(record.round_num, prev_round, where)
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
  _fsync_dir(os.path.dirname(os.path.abspath(path)))


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
  records, macs = _decode_ledger(lines, path, mac_key)
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
  return _decode_ledger(lines, path)[1]


def check_resumable(path: str) -> None:
  """Raises LedgerError if the ledger at `path` (if any) is damaged beyond a partial last
  line, the one damage a resume repairs (`repair_truncated_tail`): checked before a resume
  writes anything, so that a refused resume changes nothing."""
  if os.path.exists(path):
    lines, _ = _split_complete_lines(_read_bytes(path))
    _decode_ledger(lines, path)


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
  _fsync_dir(os.path.dirname(os.path.abspath(path)))
  return corrupt_path


def _fsync_dir(directory: str) -> None:
  """Makes a newly created directory entry durable (best effort on odd filesystems)."""
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


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
      _fsync_dir(os.path.dirname(os.path.abspath(path)))
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
    records, macs = _decode_ledger(lines, path, self.mac_key)
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
    _check_round_order(record.round_num, self._last_round, f'{self.path} line {seq}')
    line, mac = _encode(record, seq, self.mac_key, self._last_mac)
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
  _fsync_dir(os.path.dirname(os.path.abspath(path)))
  if seal_path is not None:
    _, macs = _decode_ledger(lines[:keep], path, mac_key)
    write_seal(seal_path, mac_key, keep, macs[-1].value if macs else '')
