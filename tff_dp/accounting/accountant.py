"""Post-hoc privacy accounting of a `tff_dp.ledger` (RDP and PLD via dp_accounting).

Each `RoundRecord` is one sampled round in which several Gaussian sum queries with privacy
tuples (S_g, sigma_g) ran on the same sample. By Eq. (1) of McMahan & Andrew (2018) they are
exactly one Gaussian sum query with noise multiplier

    z_eff = (sum_g (sigma_g / Delta_g)^-2)^-1/2,    Delta_g = S_g (add/remove) or 2 S_g
                                                    (replace-one: x -> x' moves the sum by 2S),

and the round is a sampled Gaussian mechanism with that z_eff.

Neighbouring relations and sampling:
  * 'add_remove' (default, user-level DP as in DP-FedAvg):
      - poisson records -> PoissonSampledDpEvent(q, .) (exact; RDP and PLD).
      - fixed_size records -> APPROXIMATED as PoissonSampledDpEvent(m / N, .), the common
        DP-FedAvg practice (McMahan et al. 2018; google-research/federated#20). This is not a
        proven bound for sampling without replacement; use Poisson sampling for rigour.
  * 'replace_one':
      - fixed_size records -> SampledWithoutReplacementDpEvent(N, m, .) (exact; RDP only,
        dp_accounting's PLD accountant does not support this event).
      - poisson records are rejected (dp_accounting has no Poisson analysis for replace-one).

Tree aggregation (DP-FTRL; records with `tree_leaf`, shuffled participation), neighbouring
relation 'replace_special' (Kairouz et al. 2021, Definition 1.1: one client's data replaced by
a special record that contributes nothing, so a tree node moves by at most its clip):
  * each round's per-node multiplier is z = sigma / S per tree, combined over the round's
    trees (update and clipped count share the tree positions) by Eq. (1);
  * within an epoch every client is in at most one round, hence in at most one tree; a tree
    never spans two epochs (refused: the factories restart at epoch boundaries). A client's
    privacy loss in the epoch is that of the one tree holding it: the epoch's RDP is the
    largest over its trees of dp_accounting's `SingleEpochTreeAggregationDpEvent(z_tree,
    steps_so_far)` (z_tree the smallest z of the tree's rounds), which for equal z is exactly
    `SingleEpochTreeAggregationDpEvent(z, [steps of each tree])` (depth of the largest tree);
  * epochs compose: RDP adds over epochs (the per-epoch events composed, as dp_accounting's
    docstring prescribes for records in several trees);
  * PLD: dp_accounting has no PLD for this event, so `epsilon_pld` is None ('n/a'), never a
    number computed for another mechanism;
  * a round recorded twice (a resume re-executed a round whose output was released) is
    refused: the re-execution reuses the tree's noise state, which no accounting here covers.

Implementation notes (why some logic is ours rather than dp_accounting's):
  * We compute z_eff ourselves (with explicit float casts) instead of relying on
    dp_accounting's `_effective_gaussian_noise_multiplier`, which silently ignores
    non-`float` multipliers (np.float32) and divides by zero for sigma = 0.
  * PLDAccountant rejects Poisson(Composed(...)), so the collapsed Gaussian(z_eff) is used.
  * RDP is incremental and exact: each round's RDP vector is that of the Poisson-sampled
    Gaussian with the round's exact z_eff, added to a running vector; epsilon is then
    `rdp_privacy_accountant.compute_epsilon` (~0.2 ms). The per-round vector is the one
    `dp_accounting.rdp.RdpAccountant` composes for that event
    (`_compute_rdp_poisson_subsampled_gaussian`), evaluated by `rdp_gaussian` with numpy
    (~1 ms instead of ~25 ms: adaptive clipping's float32 (S, sigma) give a z_eff that
    differs in its last bits every round, so every round is a new event), and cached by
    exact event (LRU) for ledgers whose z repeats. Fixed-size sampling under replace-one is
    computed by a fresh `RdpAccountant` (cached the same way).
  * PLD composition per round is slow (each compose convolves the growing PLD: ~0.4 s per
    round on a shared CPU), so PLD is lazy: `add` only queues the event and `epsilon()`
    composes the queue, grouping events (in any order: composition is commutative) and
    composing each group once with `count` (self-composition by FFT). `epsilon_curve`
    therefore reports PLD every `pld_every` rounds, and `LedgerAccountant` takes `pld_every`
    for per-round reporting in a training loop.
  * PLD groups are conservative buckets: queued events of the same sampling whose z_eff
    agree to PLD_GROUP_DIGITS (6) significant digits form one group, composed with the
    SMALLEST z_eff among its members. Less noise only increases epsilon, so PLD epsilon is
    an upper bound on the exact composition, equal to it when the members' z_eff are equal
    (fixed clipping); with adaptive clipping they differ by float32 rounding (~1e-7
    relative). Composing every distinct z_eff separately would take minutes on a 1500-round
    adaptive ledger. RDP (the curve, and the epsilon `peek_epsilon` gives a max-epsilon stop
    when 'rdp' is among the methods) never groups: it is exact.
"""

import collections
import copy
import decimal
import math
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from tff_dp import choices
from tff_dp import errors
from tff_dp import ledger
from tff_dp import noise_budget
from tff_dp.accounting import rdp_gaussian

NeighboringRelation = dp_accounting.NeighboringRelation
NEIGHBORING_RELATIONS = {
    'add_remove': NeighboringRelation.ADD_OR_REMOVE_ONE,
    'replace_one': NeighboringRelation.REPLACE_ONE,
    'replace_special': NeighboringRelation.REPLACE_SPECIAL,
}
# The relation tree-aggregation (DP-FTRL) ledgers are accounted under, and the only one.
TREE_RELATION = 'replace_special'
METHODS = tuple(choices.ACCOUNTANTS)
# PLD composes queued events whose z_eff agree to this many significant digits as one group.
PLD_GROUP_DIGITS = 6
# Per-round RDP vectors kept for reuse (least recently used dropped first): ledgers whose z
# repeats hit one entry; adaptive clipping makes every round new, so the cache is bounded.
RDP_CACHE_SIZE = 1024
DEFAULT_PLD_DISCRETIZATION = 1e-4
# Default number of PLD evaluations along a curve (plus the last round) when pld_every=None.
DEFAULT_PLD_POINTS = 20


def check_relation(neighboring_relation: str) -> NeighboringRelation:
  if neighboring_relation not in NEIGHBORING_RELATIONS:
    raise errors.UserInputError(
        f'neighboring_relation must be one of {sorted(NEIGHBORING_RELATIONS)}, got '
        f'{neighboring_relation!r}.')
  return NEIGHBORING_RELATIONS[neighboring_relation]


def check_methods(methods: Iterable[str]) -> Tuple[str, ...]:
  methods = tuple(methods)
  if not methods or any(m not in METHODS for m in methods):
    raise errors.UserInputError(f'methods must be a non-empty subset of {METHODS}, got '
                                f'{methods!r}.')
  return tuple(m for m in METHODS if m in methods)


def check_delta(delta, population_size: Optional[int] = None) -> float:
  """`delta` as a float in (0, 1), and below 1 / `population_size` when that is given.

  A delta at or above 1/N is no user-level guarantee: the mechanism that publishes one
  randomly chosen client's data in the clear satisfies (0, 1/N)-DP. So a run, a ledger
  replay and a calibration over N clients refuse it and name a delta that works.
  """
  try:
    delta = float(delta)
  except (TypeError, ValueError):
    raise errors.UserInputError(f'`delta` must be a number, got {delta!r}.') from None
  if not 0.0 < delta < 1.0:
    raise errors.UserInputError(f'`delta` must be in (0, 1), got {delta}.')
  if population_size is not None and delta * population_size >= 1.0:
    raise errors.UserInputError(
        f'`delta={delta:g}` is not below 1/population = 1/{population_size}: publishing one '
        f'random client\'s data in the clear would satisfy it; use `delta` <= '
        f'{suggested_delta(population_size):g}.')
  return delta


def suggested_delta(population_size: int) -> float:
  """A delta well below 1/population (a power of ten at most 1/(10 N)), and at most 1e-5: the
  default of runs and the value `check_delta` suggests."""
  return min(1e-5, 10 ** math.floor(math.log10(1.0 / population_size) - 1))


def population_of(records: Sequence[ledger.RoundRecord]) -> Optional[int]:
  """The smallest population a ledger's rounds sampled from (None for an empty ledger): the
  population the ledger's delta must be below 1/ of."""
  return min((r.sampling.population_size for r in records), default=None)


def default_relation(records: Sequence[ledger.RoundRecord]) -> str:
  """The relation a ledger is accounted under by default: TREE_RELATION for tree-aggregation
  ledgers (the only one they support), 'add_remove' otherwise."""
  return TREE_RELATION if any(r.tree_leaf is not None for r in records) else 'add_remove'


def check_analysable(sampling_kind: str, tree: bool) -> None:
  """UserInputError (one line saying what to use) for a sampling the accountant cannot
  analyse with this noise: tree noise needs shuffled participation, and shuffled
  participation is analysed for tree noise only."""
  if tree and sampling_kind != 'shuffled':
    raise errors.UserInputError(
        f'tree-aggregation noise (DP-FTRL) cannot be accounted with {sampling_kind} sampling '
        '(a client could be in several rounds of one tree); use `client_sampling=shuffled`.')
  if not tree and sampling_kind == 'shuffled':
    raise errors.UserInputError(
        'shuffled participation is accounted for tree-aggregation noise only (no '
        'amplification analysis for independent Gaussian noise); use `dp=ftrl` or '
        '`dp=ftrl_adaptive`, or `client_sampling=poisson`.')


def gaussian_noise_multipliers(record: ledger.RoundRecord,
                                neighboring_relation: str) -> Optional[List[float]]:
  """Per-query sigma_g / Delta_g as Python floats; None if some query is non-private.

  Queries with S_g = 0 have zero sensitivity (no privacy cost) and are omitted.
  """
  factor = 2.0 if neighboring_relation == 'replace_one' else 1.0
  multipliers = []
  for q in record.queries:
    clip, stddev = float(q.l2_norm_clip), float(q.noise_stddev)
    if clip == 0.0:
      continue
    if stddev == 0.0:
      return None
    multipliers.append(stddev / (factor * clip))
  return multipliers


def _wrap_sampling(record: ledger.RoundRecord, neighboring_relation: str,
                   inner: dp_accounting.DpEvent) -> dp_accounting.DpEvent:
  s = record.sampling
  check_analysable(s.kind, tree=False)
  if neighboring_relation == TREE_RELATION:
    raise errors.UserInputError(
        f'Round {record.round_num} adds independent Gaussian noise; neighboring relation '
        f'{TREE_RELATION} is for tree-aggregation (DP-FTRL) ledgers; use add_remove.')
  if neighboring_relation == 'add_remove':
    if s.kind == 'poisson':
      q = float(s.probability)
    else:  # Documented approximation: fixed-size treated as Poisson with q = m / N.
      q = float(s.sample_size) / float(s.population_size)
    return dp_accounting.PoissonSampledDpEvent(sampling_probability=q, event=inner)
  if s.kind == 'poisson':
    raise errors.UserInputError(
        f'Round {record.round_num} uses Poisson sampling, which is accounted under '
        "neighboring relation 'add_remove' only; use add_remove.")
  return dp_accounting.SampledWithoutReplacementDpEvent(
      source_dataset_size=int(s.population_size), sample_size=int(s.sample_size), event=inner)


def _multipliers_or_special_event(record: ledger.RoundRecord, neighboring_relation: str):
  """(noise multipliers, None), or (None, event) when the round is non-private or a no-op."""
  check_relation(neighboring_relation)
  multipliers = gaussian_noise_multipliers(record, neighboring_relation)
  if multipliers is None:
    return None, dp_accounting.NonPrivateDpEvent()
  if not multipliers:
    return None, dp_accounting.NoOpDpEvent()
  return multipliers, None


def record_to_dp_event(record: ledger.RoundRecord,
                       neighboring_relation: str = 'add_remove') -> dp_accounting.DpEvent:
  """The DpEvent of one round (Contract 2), with every number a Python float/int.

  Returns `PoissonSampledDpEvent(q, ComposedDpEvent([GaussianDpEvent(sigma_g / Delta_g)...]))`
  (or `SampledWithoutReplacementDpEvent(N, m, ...)` for fixed-size sampling under
  replace-one), `NonPrivateDpEvent` if a query with positive clip had zero noise, and
  `NoOpDpEvent` if no query touched the data.
  """
  multipliers, special = _multipliers_or_special_event(record, neighboring_relation)
  if special is not None:
    return special
  inner = dp_accounting.ComposedDpEvent(
      events=[dp_accounting.GaussianDpEvent(noise_multiplier=z) for z in multipliers])
  return _wrap_sampling(record, neighboring_relation, inner)


def round_down(value: float, digits: int) -> float:
  """Largest float <= value with `digits` significant decimal digits (a PLD group key)."""
  if value == 0.0 or not math.isfinite(value):
    return value
  d = decimal.Decimal(value)  # Exact binary value.
  exponent = d.adjusted() - digits + 1
  rounded = d.quantize(decimal.Decimal(1).scaleb(exponent), rounding=decimal.ROUND_FLOOR)
  # float() rounds to nearest; since value is a float >= rounded, the result is <= value.
  return float(rounded)


def collapsed_dp_event(record: ledger.RoundRecord,
                       neighboring_relation: str = 'add_remove') -> dp_accounting.DpEvent:
  """Like `record_to_dp_event`, with the per-round Gaussians collapsed to one (Eq. (1)).

  Equivalent to `record_to_dp_event`, with the exact z_eff (no rounding). Accepted by both
  RDP and PLD.
  """
  multipliers, special = _multipliers_or_special_event(record, neighboring_relation)
  if special is not None:
    return special
  z = noise_budget.effective_noise_multiplier(multipliers)
  return _wrap_sampling(record, neighboring_relation, dp_accounting.GaussianDpEvent(z))


def _with_noise_multiplier(event: dp_accounting.DpEvent, z: float) -> dp_accounting.DpEvent:
  """The collapsed `event` (sampling of one Gaussian) with the Gaussian's multiplier set to z."""
  if isinstance(event, dp_accounting.PoissonSampledDpEvent):
    return dp_accounting.PoissonSampledDpEvent(event.sampling_probability,
                                               dp_accounting.GaussianDpEvent(z))
  return dp_accounting.SampledWithoutReplacementDpEvent(
      event.source_dataset_size, event.sample_size, dp_accounting.GaussianDpEvent(z))


class LedgerAccountant:
  """Incremental accountant: `add(record)` per round, `epsilon()` at any time.

  Args:
    delta: target delta in (0, 1).
    methods: subset of ('rdp', 'pld').
    neighboring_relation: 'add_remove' or 'replace_one' (see module docstring).
    rdp_orders: RDP orders (default dp_accounting's DEFAULT_RDP_ORDERS).
    pld_value_discretization_interval: PLD grid (default 1e-4, dp_accounting's default).
    pld_every: `epsilon()` reports PLD only every `pld_every` records (see `epsilon`).
  """

  def __init__(self, delta: float, methods: Sequence[str] = METHODS,
               neighboring_relation: str = 'add_remove',
               rdp_orders: Optional[Sequence[float]] = None,
               pld_value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
               pld_every: int = 1):
    self.delta = check_delta(delta)
    if isinstance(pld_every, bool) or not isinstance(pld_every, int) or pld_every < 1:
      raise errors.UserInputError(f'pld_every must be a positive integer, got {pld_every!r}.')
    self.pld_every = pld_every
    self.methods = check_methods(methods)
    self.neighboring_relation = neighboring_relation
    self._relation = check_relation(neighboring_relation)
    self._orders = tuple(float(o) for o in (
        rdp_orders if rdp_orders is not None else rdp_privacy_accountant.DEFAULT_RDP_ORDERS))
    self._pld_discretization = pld_value_discretization_interval
    self._rdp_cache: 'collections.OrderedDict[dp_accounting.DpEvent, np.ndarray]' = (
        collections.OrderedDict())
    # Every record composed so far (a re-executed seeded round is merged into its first).
    self._composed = _Composed()
    self._num_records = 0
    self._reset()

  def _reset(self) -> None:
    """Composes nothing yet (the records are composed again after a merge)."""
    self._rdp = None  # Running RDP vector (numpy), None until the first private event.
    self._non_private = False
    self._pld_accountant = dp_accounting.pld.PLDAccountant(
        neighboring_relation=self._relation,
        value_discretization_interval=self._pld_discretization)
    # Events not yet composed into the PLD: group key (the event with z_eff rounded down to
    # PLD_GROUP_DIGITS) -> [smallest exact z_eff in the group, count]. Composition is
    # commutative, so a group is composed once with `count` (see the module docstring).
    self._pld_queue: Dict[dp_accounting.DpEvent, list] = {}
    self._tree: Optional[_TreeAccount] = None   # Set by the first tree record.

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
    if self._non_private:
      return np.full(len(self._orders), np.inf)
    if self._tree is not None:
      return self._tree.rdp()
    if self._rdp is None:
      return np.zeros(len(self._orders))
    return self._rdp.copy()

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
    self._reset()
    for r in self._composed.records:
      self._compose(r)

  def _compose(self, record: ledger.RoundRecord) -> None:
    if record.tree_leaf is not None:
      self._add_tree_record(record)
      return
    if self._tree is not None:
      raise errors.UserInputError(f'Round {record.round_num} adds independent Gaussian noise '
                                  'to a ledger of tree-aggregation rounds; one ledger holds '
                                  'one mechanism.')
    event = collapsed_dp_event(record, self.neighboring_relation)
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
      self._non_private = True
    elif isinstance(event, dp_accounting.NoOpDpEvent):
      pass
    else:
      if 'pld' in self.methods and not self._pld_accountant.supports(event):
        raise errors.UserInputError(
            f'PLD cannot analyse round {record.round_num} ({record.sampling.kind} sampling '
            f'under {self.neighboring_relation}); account it with RDP alone.')
      if 'rdp' in self.methods:
        rdp = self._per_round_rdp(event, record)
        self._rdp = rdp.copy() if self._rdp is None else self._rdp + rdp
      if 'pld' in self.methods:
        z = event.event.noise_multiplier
        key = _with_noise_multiplier(event, round_down(z, PLD_GROUP_DIGITS))
        group = self._pld_queue.setdefault(key, [z, 0])
        group[0] = min(group[0], z)
        group[1] += 1

  def _add_tree_record(self, record: ledger.RoundRecord) -> None:
    check_analysable(record.sampling.kind, tree=True)
    if self.neighboring_relation != TREE_RELATION:
      raise errors.UserInputError(
          f'Round {record.round_num} is tree aggregation (DP-FTRL), accounted under '
          f'neighboring relation {TREE_RELATION} only; use {TREE_RELATION}.')
    if len(self._composed.records) > 1 and self._tree is None:
      raise errors.UserInputError(f'Round {record.round_num} is tree aggregation in a ledger '
                                  'of Gaussian rounds; one ledger holds one mechanism.')
    if self._tree is None:
      self._tree = _TreeAccount(self._orders)
    multipliers = gaussian_noise_multipliers(record, TREE_RELATION)
    if multipliers is None:
      self._non_private = True
      z = 0.0
    else:
      z = noise_budget.effective_noise_multiplier(multipliers) if multipliers else math.inf
    self._tree.add(record, z)

  def _per_round_rdp(self, event: dp_accounting.DpEvent,
                     record: ledger.RoundRecord) -> np.ndarray:
    """RDP vector of one round's collapsed event, exactly as RdpAccountant composes it."""
    rdp = self._rdp_cache.get(event)
    if rdp is not None:
      self._rdp_cache.move_to_end(event)
      return rdp
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
      rdp = rdp_gaussian.poisson_sampled_gaussian_rdp(
          event.sampling_probability, event.event.noise_multiplier, self._orders)
    else:
      acc = dp_accounting.rdp.RdpAccountant(self._orders, self._relation)
      if not acc.supports(event):
        raise errors.UserInputError(f'RDP cannot analyse round {record.round_num} ({event}).')
      rdp = acc.compose(event).rdp
    self._rdp_cache[event] = rdp
    if len(self._rdp_cache) > RDP_CACHE_SIZE:
      self._rdp_cache.popitem(last=False)
    return rdp

  def epsilon_rdp(self) -> float:
    if 'rdp' not in self.methods:
      raise errors.UserInputError("RDP was not requested (methods lacks 'rdp').")
    if self._non_private:
      return math.inf
    rdp = self._tree.rdp() if self._tree is not None else self._rdp
    if rdp is None or not rdp.any():
      return 0.0
    return float(rdp_privacy_accountant.compute_epsilon(self._orders, rdp, self.delta)[0])

  def epsilon_pld(self) -> Optional[float]:
    """PLD epsilon; None (not applicable) for tree-aggregation ledgers."""
    if 'pld' not in self.methods:
      raise errors.UserInputError("PLD was not requested (methods lacks 'pld').")
    if self._tree is not None:
      return None
    for key, (z, count) in self._pld_queue.items():
      self._pld_accountant.compose(_with_noise_multiplier(key, z), count)
    self._pld_queue = {}
    if self._non_private:
      return math.inf
    return float(self._pld_accountant.get_epsilon(self.delta))

  def epsilon(self) -> Dict[str, Optional[float]]:
    """{method: epsilon} after all rounds added so far, for the requested methods.

    With `pld_every` > 1 the 'pld' value is None unless num_records is a multiple of
    `pld_every` (PLD composition costs ~0.1-1 s per call; RDP is always reported).
    """
    result = {}
    if 'rdp' in self.methods:
      result['rdp'] = self.epsilon_rdp()
    if 'pld' in self.methods:
      due = self._num_records % self.pld_every == 0
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
      trial._rdp_cache = self._rdp_cache
      trial._rdp = None if self._rdp is None else self._rdp.copy()
      trial._non_private = self._non_private
      trial._tree = copy.deepcopy(self._tree)
      trial._num_records = self._num_records
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
                            first.tree_leaf)


class _TreeAccount:
  """RDP of a tree-aggregation ledger so far (see the module docstring): closed epochs plus
  the current epoch's largest per-tree RDP."""

  def __init__(self, orders: Sequence[float]):
    self._orders = tuple(orders)
    self._closed = np.zeros(len(self._orders))   # Sum over finished epochs.
    self._epoch = None
    self._done_max = np.zeros(len(self._orders))  # Max over the epoch's finished trees.
    self._tree_z = None       # Current tree: smallest z of its rounds, and its steps.
    self._tree_steps = 0
    self._last_round = 0
    self._cache: Dict[Tuple[float, int], np.ndarray] = {}

  def _tree_rdp(self, z: float, steps: int) -> np.ndarray:
    if z == math.inf:   # No query touched the data.
      return np.zeros(len(self._orders))
    key = (z, steps)
    if key not in self._cache:
      if len(self._cache) > 64:   # Steps grow every round: old entries are not asked again.
        self._cache.clear()
      acc = dp_accounting.rdp.RdpAccountant(self._orders, NeighboringRelation.REPLACE_SPECIAL)
      event = dp_accounting.SingleEpochTreeAggregationDpEvent(float(z), int(steps))
      self._cache[key] = acc.compose(event).rdp
    return self._cache[key]

  def add(self, record: ledger.RoundRecord, z: float) -> None:
    r, leaf, epoch = record.round_num, record.tree_leaf, record.sampling.epoch
    if r != self._last_round + 1:
      raise errors.UserInputError(
          f'Round {r} follows round {self._last_round} in a tree-aggregation ledger: a resume '
          're-executed a round whose output was already released, which the tree accounting '
          'does not cover (checkpoint DP-FTRL runs every round: `rounds_per_checkpoint=1`).')
    if leaf == 1:
      if self._tree_z is not None:
        self._done_max = np.maximum(self._done_max,
                                    self._tree_rdp(self._tree_z, self._tree_steps))
      self._tree_z, self._tree_steps = z, 1
    else:
      if epoch != self._epoch:
        raise errors.UserInputError(
            f'Round {r} continues a noise tree from epoch {self._epoch} into epoch {epoch}: a '
            'client could be in that tree twice; the tree must restart at every epoch '
            '(the tree factories do with `rounds_per_epoch`).')
      if leaf != self._tree_steps + 1:
        raise errors.UserInputError(f'Round {r} is leaf {leaf} of a tree whose previous round '
                                    f'was leaf {self._tree_steps}; the ledger is inconsistent.')
      self._tree_z, self._tree_steps = min(self._tree_z, z), leaf
    if epoch != self._epoch:
      if self._epoch is not None and epoch < self._epoch:
        raise errors.UserInputError(f'Round {r} is in epoch {epoch} after epoch {self._epoch}.')
      self._closed = self._closed + self._done_max
      self._done_max = np.zeros(len(self._orders))
      self._epoch = epoch
    self._last_round = r

  def rdp(self) -> np.ndarray:
    current = self._done_max
    if self._tree_z is not None:
      current = np.maximum(current, self._tree_rdp(self._tree_z, self._tree_steps))
    return self._closed + current


def epsilon_curve(records: Sequence[ledger.RoundRecord], delta: float,
                  methods: Sequence[str] = METHODS,
                  neighboring_relation: str = 'add_remove',
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
  acc = LedgerAccountant(delta, methods, neighboring_relation, **accountant_kwargs)
  n = len(records)
  if pld_every is None:
    pld_every = max(1, math.ceil(n / DEFAULT_PLD_POINTS))
  elif isinstance(pld_every, bool) or not isinstance(pld_every, int) or pld_every < 1:
    raise errors.UserInputError(f'pld_every must be a positive integer, got {pld_every!r}.')
  curve = []
  for i, record in enumerate(records):
    acc.add(record)
    eps_pld = None
    if 'pld' in acc.methods and ((i + 1) % pld_every == 0 or i == n - 1):
      eps_pld = acc.epsilon_pld()
      if progress is not None:
        progress(i + 1, n)
    curve.append({
        'round': record.round_num,
        'epsilon_rdp': acc.epsilon_rdp() if 'rdp' in acc.methods else None,
        'epsilon_pld': eps_pld,
    })
  return curve
