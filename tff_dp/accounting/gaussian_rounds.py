"""The accountant of sampled Gaussian rounds (DP-FedAvg with fixed or adaptive clipping): each
round one sampled Gaussian mechanism with the round's z_eff (`events.collapsed_dp_event`),
composed by RDP and PLD.

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
  * A report composes the rounds since the last one, and dp_accounting builds a sampled
    Gaussian's PLD afresh at every compose (0.05-0.5 s at the run's grid, 5-10x the
    composition itself), so `_ReusingPLDAccountant` keeps the PLDs it built, by exact event:
    with a fixed z every report after the first only composes.
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
from typing import Dict, Optional, Sequence

import dp_accounting
import numpy as np

from tff_dp import errors
from tff_dp import ledger
from tff_dp.accounting import claims
from tff_dp.accounting import events
from tff_dp.accounting import mechanism_account
from tff_dp.accounting import noise_family
from tff_dp.accounting import rdp_gaussian

# PLD composes queued events whose z_eff agree to this many significant digits as one group.
PLD_GROUP_DIGITS = 6
# One-round PLDs kept for reuse (least recently used dropped first): a fixed z hits one entry.
PLD_CACHE_SIZE = 8
# Per-round RDP vectors kept for reuse (least recently used dropped first): ledgers whose z
# repeats hit one entry; adaptive clipping makes every round new, so the cache is bounded.
RDP_CACHE_SIZE = 1024


class GaussianRounds(mechanism_account.MechanismAccount):
  """Sampled Gaussian rounds (Poisson, or fixed-size) under add/remove or replace-one."""
  name = 'sampled Gaussian rounds'

  def __init__(self, orders: Sequence[float], neighboring_relation: str,
               methods: Sequence[str], pld_discretization: float):
    super().__init__(orders, neighboring_relation, methods, pld_discretization)
    # Zero-out Poisson rounds compose as add/remove (`events.dp_accounting_relation`).
    self._relation = events.dp_accounting_relation(neighboring_relation, sampled=True)
    self._rdp_cache: 'collections.OrderedDict[dp_accounting.DpEvent, np.ndarray]' = (
        collections.OrderedDict())
    self._rdp = None  # Running RDP vector (numpy), None until the first private event.
    self._non_private = False
    self._pld_accountant = _ReusingPLDAccountant(
        neighboring_relation=self._relation, value_discretization_interval=pld_discretization)
    # Events not yet composed into the PLD: group key (the event with z_eff rounded down to
    # PLD_GROUP_DIGITS) -> [smallest exact z_eff in the group, count]. Composition is
    # commutative, so a group is composed once with `count` (see the module docstring).
    self._pld_queue: Dict[dp_accounting.DpEvent, list] = {}

  def compose(self, record: ledger.RoundRecord) -> None:
    event = events.collapsed_dp_event(record, self.neighboring_relation)
    if isinstance(event, dp_accounting.NonPrivateDpEvent):
      self._non_private = True
      return
    if isinstance(event, dp_accounting.NoOpDpEvent):
      return
    if 'pld' in self.methods and not self._pld_accountant.supports(event):
      raise errors.UserInputError(
          f'PLD cannot analyse round {record.round_num} ({record.sampling.kind} sampling '
          f'under {self.neighboring_relation}); account it with RDP alone.')
    if 'rdp' in self.methods:
      rdp = self._per_round_rdp(event, record)
      self._rdp = rdp.copy() if self._rdp is None else self._rdp + rdp
    if 'pld' in self.methods:
      z = event.event.noise_multiplier
      key = events.with_noise_multiplier(event, events.round_down(z, PLD_GROUP_DIGITS))
      group = self._pld_queue.setdefault(key, [z, 0])
      group[0] = min(group[0], z)
      group[1] += 1

  def _per_round_rdp(self, event: dp_accounting.DpEvent,
                     record: ledger.RoundRecord) -> np.ndarray:
    """RDP vector of one round's collapsed event, exactly as RdpAccountant composes it."""
    rdp = self._rdp_cache.get(event)
    if rdp is not None:
      self._rdp_cache.move_to_end(event)
      return rdp
    if isinstance(event, dp_accounting.PoissonSampledDpEvent):
      rdp = rdp_gaussian.poisson_sampled_gaussian_rdp(
          event.sampling_probability, event.event.noise_multiplier, self.orders)
    else:
      acc = dp_accounting.rdp.RdpAccountant(self.orders, self._relation)
      if not acc.supports(event):
        raise errors.UserInputError(f'RDP cannot analyse round {record.round_num} ({event}).')
      rdp = acc.compose(event).rdp
    self._rdp_cache[event] = rdp
    if len(self._rdp_cache) > RDP_CACHE_SIZE:
      self._rdp_cache.popitem(last=False)
    return rdp

  def rdp(self) -> np.ndarray:
    if self._non_private:
      return np.full(len(self.orders), np.inf)
    if self._rdp is None:
      return np.zeros(len(self.orders))
    return self._rdp.copy()

  def epsilon_pld(self, delta: float) -> Optional[float]:
    for key, (z, count) in self._pld_queue.items():
      self._pld_accountant.compose(events.with_noise_multiplier(key, z), count)
    self._pld_queue = {}
    if self._non_private:
      return float('inf')
    return float(self._pld_accountant.get_epsilon(delta))

  def rdp_copy(self) -> 'GaussianRounds':
    trial = type(self)(self.orders, self.neighboring_relation, ('rdp',),
                           self.pld_discretization)
    trial._rdp_cache = self._rdp_cache   # Shared: entries are immutable per exact event.
    trial._rdp = None if self._rdp is None else self._rdp.copy()
    trial._non_private = self._non_private
    return trial

  def __deepcopy__(self, memo):
    """A copy for a PLD trial (`peek_epsilon` without RDP): the queue is flushed first."""
    other = copy.copy(self)
    other._rdp = None if self._rdp is None else self._rdp.copy()
    other._pld_queue = dict(self._pld_queue)
    other._pld_accountant = copy.deepcopy(self._pld_accountant, memo)
    return other


class _ReusingPLDAccountant(dp_accounting.pld.PLDAccountant):
  """dp_accounting's PLD accountant, keeping the PLD of each Poisson-sampled Gaussian event it
  built (the last `PLD_CACHE_SIZE`, by exact event) instead of building it at every compose.

  Why ours: dp_accounting composes such an event as `from_gaussian_mechanism(...)` followed by
  `self_compose(count)` and `compose`, and has no hook to reuse the first step. Everything else
  is its own code, called with the same arguments, so the result is the same bits (tested
  against a plain `PLDAccountant`). Pinned to dp-accounting 0.4.3's `_maybe_compose`.
  """

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self._built: 'collections.OrderedDict[dp_accounting.DpEvent, object]' = (
        collections.OrderedDict())

  def _maybe_compose(self, event, count, do_compose):
    if not (do_compose and _is_private_sampled_gaussian(event) and self.neighboring_relation
            == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE):
      return super()._maybe_compose(event, count, do_compose)
    one_round = self._built.pop(event, None)
    if one_round is None:
      one_round = dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism(
          standard_deviation=event.event.noise_multiplier,
          value_discretization_interval=self._value_discretization_interval,
          sampling_prob=event.sampling_probability)
    self._built[event] = one_round
    while len(self._built) > PLD_CACHE_SIZE:
      self._built.popitem(last=False)
    self._pld = self._pld.compose(one_round.self_compose(count))
    return None


def _is_private_sampled_gaussian(event) -> bool:
  return (isinstance(event, dp_accounting.PoissonSampledDpEvent)
          and isinstance(event.event, dp_accounting.GaussianDpEvent)
          and event.sampling_probability != 0 and event.event.noise_multiplier != 0)


# Independent Gaussian noise every round (DP-FedAvg), composed by `GaussianRounds`.
FAMILY = noise_family.register(noise_family.NoiseFamily(
    name=claims.INDEPENDENT_NOISE, title='independent Gaussian noise',
    unproven_because='its amplification of this noise is not analysed',
    statement='DP-FedAvg ({dp} clipping, Gaussian noise), as recorded in ledger.jsonl',
    account=GaussianRounds, noise_in_round_queries=True, named_in_records=False))
