"""`SamplingEvent`: how a round's clients were selected, as the ledger records it, and the
shapes of the kinds it records (which fields each kind carries)."""

import dataclasses
from typing import Optional

from tff_dp.ledger.values import LedgerError
from tff_dp.ledger.values import as_float
from tff_dp.ledger.values import as_int


@dataclasses.dataclass(frozen=True)
class EventShape:
  """Which fields a kind of `SamplingEvent` carries: a `probability` (else a `sample_size`),
  an `epoch` (the permutation's epoch, or the cycle), a number of `groups`."""
  probability: bool = False
  epoch: bool = False
  groups: bool = False


# The sampling events the format records: kind -> its shape. The built-in samplers' kinds are
# written here so that a ledger reads without the samplers imported; a sampler registered
# later adds its own (`register_sampling_kind`, called by `tff_dp.sampling.register`).
_SHAPES: dict[str, EventShape] = {
    'poisson': EventShape(probability=True),
    'fixed_size': EventShape(),
    'shuffled': EventShape(epoch=True),
    'min_separation': EventShape(epoch=True),
    'cyclic_poisson': EventShape(probability=True, epoch=True, groups=True),
}
SAMPLING_KINDS = _SHAPES.keys()   # A live view: registered kinds included.


def register_sampling_kind(kind: str, shape: EventShape) -> None:
  """Lets `SamplingEvent`s of `kind` be recorded, with `shape`'s fields; ValueError if the
  kind is known with another shape."""
  if _SHAPES.setdefault(kind, shape) != shape:
    raise ValueError(f'sampling kind {kind!r} is recorded with {_SHAPES[kind]}, not {shape}')


def sampling_shape(kind: str) -> EventShape:
  """The fields of a `kind` event (LedgerError naming the kinds if it has none)."""
  if kind not in _SHAPES:
    raise LedgerError(f'SamplingEvent.kind must be one of {tuple(_SHAPES)}, got {kind!r}.')
  return _SHAPES[kind]


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
    shape = sampling_shape(self.kind)
    n = as_int(self.population_size, 'SamplingEvent.population_size', 1)
    object.__setattr__(self, 'population_size', n)
    if shape.probability:
      if self.probability is None or self.sample_size is not None:
        raise LedgerError(f'A {self.kind} SamplingEvent needs probability and no sample_size.')
      q = as_float(self.probability, 'SamplingEvent.probability', allow_zero=False)
      if q > 1:
        raise LedgerError(f'SamplingEvent.probability must be in (0, 1], got {q!r}.')
      object.__setattr__(self, 'probability', q)
    else:
      if self.sample_size is None or self.probability is not None:
        raise LedgerError(f'A {self.kind} SamplingEvent needs sample_size and no probability.')
      m = as_int(self.sample_size, 'SamplingEvent.sample_size', 1)
      if m > n:
        raise LedgerError(
            f'SamplingEvent.sample_size ({m}) exceeds population_size ({n}).')
      object.__setattr__(self, 'sample_size', m)
    if shape.epoch:
      object.__setattr__(self, 'epoch', as_int(self.epoch, 'SamplingEvent.epoch', 1))
    elif self.epoch is not None:
      raise LedgerError(f'A {self.kind} SamplingEvent has no epoch, got {self.epoch!r}.')
    if shape.groups:
      object.__setattr__(self, 'groups', as_int(self.groups, 'SamplingEvent.groups', 1))
    elif self.groups is not None:
      raise LedgerError(f'A {self.kind} SamplingEvent has no groups, got {self.groups!r}.')
    if not isinstance(self.seeded, bool):
      raise LedgerError(f'SamplingEvent.seeded must be true or false, got {self.seeded!r}.')
    if not isinstance(self.probability_given, bool):
      raise LedgerError(f'SamplingEvent.probability_given must be true or false, got '
                        f'{self.probability_given!r}.')
    if self.probability_given and not shape.probability:
      raise LedgerError(f'A {self.kind} SamplingEvent has no probability to be given.')

  def to_json(self) -> dict:
    out = dataclasses.asdict(self)
    shape = sampling_shape(self.kind)
    if not shape.epoch:
      del out['epoch']   # Lines written before shuffled sampling existed stay the same.
    if not self.seeded:
      del out['seeded']   # Likewise for secret samples.
    if not shape.groups:
      del out['groups']
    if not self.probability_given:
      del out['probability_given']   # Ledgers written before it read the same.
    return out
