"""The privacy ledger's records (`RoundRecord`: a round's sampling event, its Gaussian sum
queries and its correlated noise) and their JSON form, each field checked when read.

The line format, its MACs and the seal are `lines`; the file is `storage`; the package's
docstring specifies all three.
"""

import dataclasses
from typing import Any, Optional, Tuple

from tff_dp.ledger.sampling_events import SAMPLING_KINDS
from tff_dp.ledger.sampling_events import EventShape
from tff_dp.ledger.sampling_events import SamplingEvent
from tff_dp.ledger.sampling_events import sampling_shape
from tff_dp.ledger.values import LedgerError
from tff_dp.ledger.values import as_float
from tff_dp.ledger.values import as_int


SCHEMA_VERSION = 2


READABLE_SCHEMA_VERSIONS = (1, 2)


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
                       as_float(self.l2_norm_clip, f'query {self.name!r} l2_norm_clip'))
    object.__setattr__(self, 'noise_stddev',
                       as_float(self.noise_stddev, f'query {self.name!r} noise_stddev'))

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
      object.__setattr__(self, name, as_int(getattr(self, name), f'CorrelatedNoise.{name}', 1))
    object.__setattr__(self, 'buf_decay', tuple(
        as_float(v, 'CorrelatedNoise.buf_decay') for v in self.buf_decay))
    object.__setattr__(self, 'output_scale', tuple(
        as_float(v, 'CorrelatedNoise.output_scale') for v in self.output_scale))
    if len(self.buf_decay) != len(self.output_scale):
      raise LedgerError('CorrelatedNoise.buf_decay and output_scale differ in length.')
    object.__setattr__(self, 'coefs', tuple(
        as_float(v, 'CorrelatedNoise.coefs') for v in self.coefs))
    if [self.bands is not None, bool(self.buf_decay), bool(self.coefs)].count(True) != 1:
      raise LedgerError('CorrelatedNoise records one strategy: a banded one\'s `bands`, a '
                        'BLT\'s `buf_decay` and `output_scale`, or another\'s `coefs`.')
    if self.coefs and self.coefs[0] <= 0:
      raise LedgerError(f'CorrelatedNoise.coefs must start with a positive coefficient, got '
                        f'{self.coefs[0]}.')
    if self.bands is not None:
      object.__setattr__(self, 'bands', as_int(self.bands, 'CorrelatedNoise.bands', 1))

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
  `noise`: the name of the record's noise family when it is a registered one
  (`tff_dp.accounting.noise_family`), which its account composes; None (not written) for the
  built-in families, which the record's shape tells apart.
  """
  round_num: int
  sampling: SamplingEvent
  queries: Tuple[GaussianSumQuery, ...]
  tree_leaf: Optional[int] = None
  correlated: Optional[CorrelatedNoise] = None
  noise: Optional[str] = None

  def __post_init__(self):
    object.__setattr__(self, 'round_num', as_int(self.round_num, 'RoundRecord.round_num', 0))
    if self.tree_leaf is not None:
      object.__setattr__(self, 'tree_leaf', as_int(self.tree_leaf, 'RoundRecord.tree_leaf', 1))
    if self.correlated is not None and not isinstance(self.correlated, CorrelatedNoise):
      raise LedgerError(f'RoundRecord.correlated must be a CorrelatedNoise, got '
                        f'{self.correlated!r}.')
    if not isinstance(self.sampling, SamplingEvent):
      raise LedgerError(f'RoundRecord.sampling must be a SamplingEvent, got {self.sampling!r}.')
    if self.noise is not None and (not isinstance(self.noise, str) or not self.noise):
      raise LedgerError(f'RoundRecord.noise must name a noise family, got {self.noise!r}.')
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
    if self.noise is not None:
      out['noise'] = self.noise
    return out

  @classmethod
  def from_json(cls, obj: Any) -> 'RoundRecord':
    """Strict inverse of `to_json`: exact key sets, JSON types, then value validation."""
    tree = isinstance(obj, dict) and 'tree_leaf' in obj
    correlated = isinstance(obj, dict) and 'correlated' in obj
    named = isinstance(obj, dict) and 'noise' in obj
    _check_keys(obj, {'round_num', 'sampling', 'queries'} | ({'tree_leaf'} if tree else set())
                | ({'correlated'} if correlated else set())
                | ({'noise'} if named else set()), 'record')
    if correlated:
      fields = {f.name for f in dataclasses.fields(CorrelatedNoise)}
      _check_keys(obj['correlated'], fields if 'coefs' in obj['correlated'] else
                  fields - {'coefs'}, 'correlated')
    s = obj['sampling']
    kind = s.get('kind') if isinstance(s, dict) else None
    known = isinstance(kind, str) and kind in SAMPLING_KINDS
    shape = sampling_shape(kind) if known else EventShape()   # Unknown: refused below.
    seeded = isinstance(s, dict) and 'seeded' in s
    given = isinstance(s, dict) and 'probability_given' in s
    _check_keys(s, {'kind', 'population_size', 'probability', 'sample_size'}
                | ({'epoch'} if shape.epoch else set()) | ({'seeded'} if seeded else set())
                | ({'groups'} if shape.groups else set())
                | ({'probability_given'} if given else set()), 'sampling')
    for name, present in (('seeded', seeded), ('probability_given', given)):
      if present and s[name] is not True:
        raise LedgerError(f'sampling.{name} is written only as true, got {s[name]!r}.')
    if not isinstance(obj['queries'], list):
      raise LedgerError('record.queries must be a list.')
    integers = [('round_num', obj['round_num']), ('population_size', s['population_size'])]
    integers += [('tree_leaf', obj['tree_leaf'])] if tree else []
    integers += [('epoch', s['epoch'])] if shape.epoch else []
    integers += [('groups', s['groups'])] if shape.groups else []
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
               CorrelatedNoise(**obj['correlated']) if correlated else None, obj.get('noise'))


def _check_keys(obj: Any, keys: set, what: str) -> None:
  if not isinstance(obj, dict):
    raise LedgerError(f'{what} must be a JSON object, got {type(obj).__name__}.')
  if set(obj) != keys:
    raise LedgerError(f'{what} has keys {sorted(obj)}, expected {sorted(keys)}.')


def _check_json_number(v: Any, what: str) -> None:
  if isinstance(v, bool) or not isinstance(v, (int, float)):
    raise LedgerError(f'{what} must be a JSON number, got {v!r}.')
