"""Post-hoc privacy accounting of a `tff_dp.ledger` (RDP and PLD via dp_accounting).

`LedgerAccountant` composes a ledger's records one by one and reports epsilon at any time; it
composes them through the account of the ledger's noise family (`noise_families.of_record`,
`mechanism_account`): sampled Gaussian rounds (`gaussian_rounds`: DP-FedAvg, fixed or adaptive clipping; add/remove or
replace-one), tree aggregation (`tree_rounds`: DP-FTRL, replace-special) or correlated noise
(`correlated_rounds`: BLT / BandMF DP-FTRL, min separation, add/remove). How a record
becomes a dp_accounting event, under each relation, is `events`. One ledger holds one
mechanism: a record of another is refused.

A round recorded again after a crash re-executed it with a seeded sample (the same clients) is
one sample released twice: it is merged into its first record (`merged_records`), one sampled
Gaussian over the queries of both executions.
"""

import copy
import math
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from tff_dp import choices
from tff_dp import errors
from tff_dp import ledger
from tff_dp.accounting import claims
from tff_dp.accounting.delta import check_delta
from tff_dp.accounting.delta import suggested_delta  # pylint: disable=unused-import
from tff_dp.accounting import events
from tff_dp.accounting import mechanism_account
from tff_dp.accounting import noise_families
# The record-to-event functions, under the names this module's users know them by.
from tff_dp.accounting.events import check_analysable  # pylint: disable=unused-import
from tff_dp.accounting.events import check_relation  # pylint: disable=unused-import
from tff_dp.accounting.events import collapsed_dp_event  # pylint: disable=unused-import
from tff_dp.accounting.events import gaussian_noise_multipliers  # pylint: disable=unused-import
from tff_dp.accounting.events import NEIGHBORING_RELATIONS  # pylint: disable=unused-import
from tff_dp.accounting.events import record_to_dp_event  # pylint: disable=unused-import
from tff_dp.accounting.events import round_down  # pylint: disable=unused-import
from tff_dp.accounting.events import TREE_RELATION

METHODS = tuple(choices.ACCOUNTANTS)
DEFAULT_PLD_DISCRETIZATION = 1e-4
# Default number of PLD evaluations along a curve (plus the last round) when pld_every=None.
DEFAULT_PLD_POINTS = 20


def check_methods(methods: Iterable[str]) -> Tuple[str, ...]:
  methods = tuple(methods)
  if not methods or any(m not in METHODS for m in methods):
    raise errors.UserInputError(f'methods must be a non-empty subset of {METHODS}, got '
                                f'{methods!r}.')
  return tuple(m for m in METHODS if m in methods)


def population_of(records: Sequence[ledger.RoundRecord]) -> Optional[int]:
  """The smallest population a ledger's rounds sampled from (None for an empty ledger): the
  population the ledger's delta must be below 1/ of."""
  return min((r.sampling.population_size for r in records), default=None)


def default_relation(records: Sequence[ledger.RoundRecord]) -> str:
  """The relation a ledger is accounted under by default: its claim's (`claims`: the
  relation of the run's per-round epsilon columns); 'add_remove' for an empty ledger."""
  found = claims.claim_for_records(records)
  return found.columns_relation if found is not None else 'add_remove'


class LedgerAccountant:
  """Incremental accountant: `add(record)` per round, `epsilon()` at any time.

  Args:
    delta: target delta in (0, 1).
    methods: subset of ('rdp', 'pld').
    neighboring_relation: 'add_remove', 'replace_one' or 'replace_special' (`events`); None
      (default): the claim of the ledger's first record (`claims`), the relation its proof
      supports. A relation the claim does not support is refused.
    rdp_orders: RDP orders (default dp_accounting's DEFAULT_RDP_ORDERS).
    pld_value_discretization_interval: PLD grid (default 1e-4, dp_accounting's default).
    pld_every: `epsilon()` reports PLD only every `pld_every` records (see `epsilon`).
  """

  def __init__(self, delta: float, methods: Sequence[str] = METHODS,
               neighboring_relation: Optional[str] = None,
               rdp_orders: Optional[Sequence[float]] = None,
               pld_value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
               pld_every: int = 1):
    self.delta = check_delta(delta)
    if isinstance(pld_every, bool) or not isinstance(pld_every, int) or pld_every < 1:
      raise errors.UserInputError(f'pld_every must be a positive integer, got {pld_every!r}.')
    self.pld_every = pld_every
    self.methods = check_methods(methods)
    self.neighboring_relation = neighboring_relation
    if neighboring_relation is not None:
      check_relation(neighboring_relation)
    self._orders = tuple(float(o) for o in (
        rdp_orders if rdp_orders is not None else rdp_privacy_accountant.DEFAULT_RDP_ORDERS))
    self._pld_discretization = pld_value_discretization_interval
    # Every record composed so far (a re-executed seeded round is merged into its first).
    self._composed = _Composed()
    self._num_records = 0
    self._account: Optional[mechanism_account.MechanismAccount] = None
    self._family = None   # The ledger's noise family (its first record's).
    self._population: Optional[int] = None
    self._rate_given = False   # Whether round 1's rate was given (`claims.Claim.rate`).

  @property
  def num_records(self) -> int:
    return self._num_records

  @property
  def orders(self) -> np.ndarray:
    """RDP orders."""
    return np.array(self._orders)

  @property
  def rdp(self) -> np.ndarray:
    """Running RDP vector at `orders` (inf if a non-private round was added)."""
    if self._account is None:
      return np.zeros(len(self._orders))
    return self._account.rdp()

  def add(self, record: ledger.RoundRecord) -> None:
    """Composes one round. Raises UserInputError if a method cannot analyse it.

    A record of a round already composed whose sample is seeded (`sampling.seeded`: a resume
    re-executed a released round and drew the same clients again) is not a new sample: both
    executions are one sample released twice, which is exactly one sampled Gaussian over the
    queries of both (Eq. (1) composes queries on one sample). The earlier record is replaced
    by that merge and the ledger composed again (rare: only after a crash). A re-executed
    round with secret sampling drew a fresh sample and composes as a round of its own.
    """
    if not isinstance(record, ledger.RoundRecord):
      raise errors.UserInputError(f'add expects a RoundRecord, got {type(record).__name__}.')
    self._num_records += 1
    if not self._composed.add(record):
      self._compose(record)
      return
    self._account = None
    for r in self._composed.records:
      self._compose(r)

  def _compose(self, record: ledger.RoundRecord) -> None:
    """Composes `record` into the ledger's mechanism account (chosen by the first record)."""
    if self._account is None:
      found = claims.claim_of_record(record)
      if self.neighboring_relation is None:
        self.neighboring_relation = found.columns_relation
      claims.check_relation(found, self.neighboring_relation)
      self._population = record.sampling.population_size
      self._rate_given = record.sampling.probability_given
      self._family = noise_families.of_record(record)
      self._account = self._family.account(self._orders, self.neighboring_relation,
                                           self.methods, self._pld_discretization)
    elif record.sampling.population_size != self._population:
      raise errors.UserInputError(
          f'Round {record.round_num} samples from {record.sampling.population_size} clients, '
          f'round 1 from {self._population}: one run samples one population (a changed '
          'population breaks the sampler\'s schedule and its claim).')
    elif noise_families.of_record(record) is not self._family:
      raise errors.UserInputError(
          f'Round {record.round_num} is {noise_families.of_record(record).title} in a ledger '
          f'of {self._family.title}; one ledger holds one mechanism.')
    elif record.sampling.probability_given != self._rate_given:
      raise errors.UserInputError(
          f'Round {record.round_num}\'s sampling rate was '
          f'{_rate(record.sampling.probability_given)}, round 1\'s '
          f'{_rate(self._rate_given)}: one run has one claim (`claims`).')
    self._account.compose(record)

  def epsilon_rdp(self) -> float:
    if 'rdp' not in self.methods:
      raise errors.UserInputError("RDP was not requested (methods lacks 'rdp').")
    rdp = self.rdp
    if np.isinf(rdp).all():
      return math.inf
    if not rdp.any():
      return 0.0
    return float(rdp_privacy_accountant.compute_epsilon(self._orders, rdp, self.delta)[0])

  def epsilon_pld(self) -> Optional[float]:
    """PLD epsilon; None (not applicable) for a mechanism PLD does not analyse (the tree)."""
    if 'pld' not in self.methods:
      raise errors.UserInputError("PLD was not requested (methods lacks 'pld').")
    if self._account is None:
      return 0.0
    return self._account.epsilon_pld(self.delta)

  def epsilon(self, final: bool = False) -> Dict[str, Optional[float]]:
    """{method: epsilon} after all rounds added so far, for the requested methods.

    With `pld_every` > 1 the 'pld' value is None unless num_records is a multiple of
    `pld_every` (a PLD report costs ~0.02-0.5 s; RDP is always reported), or
    `final` (the last round of a run, whose PLD value is always reported).
    """
    result = {}
    if 'rdp' in self.methods:
      result['rdp'] = self.epsilon_rdp()
    if 'pld' in self.methods:
      due = final or self._num_records % self.pld_every == 0
      result['pld'] = self.epsilon_pld() if due else None
    return result

  def peek_epsilon(self, record: ledger.RoundRecord) -> float:
    """Epsilon if `record` were added next, without adding it (e.g. for a max-epsilon stop).

    Uses RDP when requested (cheap, and an upper bound at least as large as PLD's in
    practice, so stopping on it is conservative); otherwise PLD on a copy.
    """
    if 'rdp' in self.methods:
      trial = LedgerAccountant(self.delta, ('rdp',), self.neighboring_relation, self._orders)
      # pylint: disable=protected-access
      trial._account = None if self._account is None else self._account.rdp_copy()
      trial._family = self._family
      trial._num_records = self._num_records
      trial._population = self._population
      trial._rate_given = self._rate_given
      trial._composed = self._composed.copy()
      # pylint: enable=protected-access
      trial.add(record)
      return trial.epsilon_rdp()
    if record.tree_leaf is not None:
      raise errors.UserInputError('PLD cannot analyse tree aggregation (DP-FTRL); use RDP.')
    self.epsilon_pld()  # Flush the queue so the copy is small to build.
    trial = copy.deepcopy(self)
    trial.add(record)
    return trial.epsilon_pld()


def _rate(given: bool) -> str:
  """How a sampling rate came to be (`SamplingEvent.probability_given`), in words."""
  return 'given' if given else 'derived from the population'


class _Composed:
  """Records composed so far, a re-executed seeded round merged into its first execution
  (`LedgerAccountant.add`), with each round's latest record found in O(1)."""

  def __init__(self):
    self.records: List[ledger.RoundRecord] = []
    self._last_of_round: Dict[int, int] = {}

  def add(self, record: ledger.RoundRecord) -> bool:
    """Adds `record`; True if it was merged into an earlier record of the same sample."""
    i = self._last_of_round.get(record.round_num)
    if (i is not None and record.sampling.seeded and record.tree_leaf is None
        and record.correlated is None
        and self.records[i].sampling == record.sampling):
      self.records[i] = merged_reexecution(self.records[i], record)
      return True
    self._last_of_round[record.round_num] = len(self.records)
    self.records.append(record)
    return False

  def copy(self) -> '_Composed':
    """An independent copy (the records themselves are immutable and shared)."""
    other = _Composed()
    other.records, other._last_of_round = list(self.records), dict(self._last_of_round)
    return other


def merged_records(records: Sequence[ledger.RoundRecord]) -> List[ledger.RoundRecord]:
  """`records` with every re-executed seeded round merged into its first execution."""
  composed = _Composed()
  for record in records:
    composed.add(record)
  return composed.records


def merged_reexecution(first: ledger.RoundRecord,
                       again: ledger.RoundRecord) -> ledger.RoundRecord:
  """The record of one seeded sample released twice: its queries are those of both
  executions (z_eff = (z_1^-2 + z_2^-2)^-1/2 for one query each, e.g. z / sqrt(2))."""
  return ledger.RoundRecord(first.round_num, first.sampling, first.queries + again.queries,
                            first.tree_leaf, noise=first.noise)


def epsilon_curve(records: Sequence[ledger.RoundRecord], delta: float,
                  methods: Sequence[str] = METHODS,
                  neighboring_relation: Optional[str] = None,
                  pld_every: Optional[int] = None,
                  progress: Optional[Callable[[int, int], None]] = None,
                  **accountant_kwargs) -> List[Dict[str, Optional[float]]]:
  """Epsilon after each record: [dict(round, epsilon_rdp, epsilon_pld), ...] in file order.

  RDP is reported after every record. PLD is reported after every `pld_every`-th record and
  after the last one (None elsewhere); `pld_every=None` picks it so that about
  DEFAULT_PLD_POINTS (20) PLD evaluations are made, since each costs ~0.1-1 s.
  Duplicate round numbers (rounds re-executed after a resume) are all composed.
  `progress(done, total)`, if given, is called after each PLD evaluation and at the end.
  """
  check_delta(delta, population_of(records))
  n = len(records)
  if pld_every is None:
    pld_every = max(1, math.ceil(n / DEFAULT_PLD_POINTS))
  acc = LedgerAccountant(delta, methods, neighboring_relation, pld_every=pld_every,
                         **accountant_kwargs)
  curve = []
  for i, record in enumerate(records):
    acc.add(record)
    epsilons = acc.epsilon(final=i == n - 1)
    if progress is not None and (epsilons.get('pld') is not None or i == n - 1):
      progress(i + 1, n)
    curve.append({'round': record.round_num, 'epsilon_rdp': epsilons.get('rdp'),
                  'epsilon_pld': epsilons.get('pld')})
  return curve
