"""The accountant of tree aggregation (DP-FTRL) ledgers.

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
"""

import copy
import math
from typing import Dict, Sequence, Tuple

import dp_accounting
import numpy as np

from tff_dp import errors
from tff_dp import ledger
from tff_dp import noise_budget
from tff_dp.accounting import events
from tff_dp.accounting import mechanism_account
from tff_dp.accounting import noise_family


class TreeRounds(mechanism_account.MechanismAccount):
  """RDP of a tree-aggregation ledger so far (see the module docstring): closed epochs plus
  the current epoch's largest per-tree RDP."""
  name = 'tree aggregation (DP-FTRL)'

  def __init__(self, orders: Sequence[float], neighboring_relation: str,
               methods: Sequence[str], pld_discretization: float):
    super().__init__(orders, neighboring_relation, methods, pld_discretization)
    self._orders = self.orders
    self._non_private = False
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
      acc = dp_accounting.rdp.RdpAccountant(self._orders,
                                            dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
      event = dp_accounting.SingleEpochTreeAggregationDpEvent(float(z), int(steps))
      self._cache[key] = acc.compose(event).rdp
    return self._cache[key]

  def compose(self, record: ledger.RoundRecord) -> None:
    events.check_analysable(record.sampling.kind, 'tree')
    if self.neighboring_relation != events.TREE_RELATION:
      raise errors.UserInputError(
          f'Round {record.round_num} is tree aggregation (DP-FTRL), accounted under '
          f'neighboring relation {events.TREE_RELATION} only; use {events.TREE_RELATION}.')
    multipliers = events.gaussian_noise_multipliers(record, events.TREE_RELATION)
    if multipliers is None:
      self._non_private = True
      z = 0.0
    else:
      z = noise_budget.effective_noise_multiplier(multipliers) if multipliers else math.inf
    self._add(record, z)

  def _add(self, record: ledger.RoundRecord, z: float) -> None:
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
    if self._non_private:
      return np.full(len(self._orders), np.inf)
    current = self._done_max
    if self._tree_z is not None:
      current = np.maximum(current, self._tree_rdp(self._tree_z, self._tree_steps))
    return self._closed + current

  def epsilon_pld(self, delta: float) -> None:
    del delta   # dp_accounting has no PLD of tree aggregation: not applicable, never a guess.

  def rdp_copy(self) -> 'TreeRounds':
    return copy.deepcopy(self)


def _epoch(cycle, total_rounds, own, amplified) -> dict:
  # The tree restarts every epoch of the shuffled sampler.
  del total_rounds, own, amplified
  return {'rounds_per_epoch': cycle}


# Tree-aggregation noise (DP-FTRL), composed by `TreeRounds`.
FAMILY = noise_family.register(noise_family.NoiseFamily(
    name='tree', title='tree-aggregation noise (DP-FTRL)',
    unproven_because='a client could be in several rounds of one tree',
    statement='DP-FTRL ({dp}: tree-aggregation noise), as recorded in ledger.jsonl',
    account=TreeRounds, carries_state=True, records_tree_leaf=True, schedule_arguments=_epoch,
    named_in_records=False))
