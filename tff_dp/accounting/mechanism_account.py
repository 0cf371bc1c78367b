"""The interface every mechanism's accountant implements, in the style of dp_accounting's
`PrivacyAccountant` (`supports` / `compose` / `get_epsilon`).

A `LedgerAccountant` composes a ledger through one `MechanismAccount`: the first in its list
(`accountant.ACCOUNTS`) whose `supports` accepts the ledger's first record. Every later record
must be supported by the same account: one ledger holds one mechanism. A new mechanism adds an
account (a subclass in its own module, added to `ACCOUNTS`), never a branch elsewhere.
"""

from typing import Optional, Sequence

import numpy as np

from tff_dp import ledger


class MechanismAccount:
  """The privacy loss of the rounds of one mechanism composed so far.

  Args:
    orders: RDP orders.
    neighboring_relation: the relation the ledger is accounted under ('add_remove', ...).
    methods: the requested methods ('rdp', 'pld').
    pld_discretization: PLD value discretization interval.
  """
  name = 'mechanism'   # How messages name the mechanism.

  def __init__(self, orders: Sequence[float], neighboring_relation: str,
               methods: Sequence[str], pld_discretization: float):
    self.orders = tuple(orders)
    self.neighboring_relation = neighboring_relation
    self.methods = tuple(methods)
    self.pld_discretization = pld_discretization

  @staticmethod
  def supports(record: ledger.RoundRecord) -> bool:
    """Whether this account analyses `record`'s mechanism (its relation is checked by
    `compose`, which says what to use)."""
    raise NotImplementedError

  def compose(self, record: ledger.RoundRecord) -> None:
    """Adds one round; UserInputError (naming what to use) if it cannot be analysed."""
    raise NotImplementedError

  def rdp(self) -> np.ndarray:
    """The running RDP vector at `orders` (inf everywhere after a non-private round)."""
    raise NotImplementedError

  def epsilon_pld(self, delta: float) -> Optional[float]:
    """PLD epsilon at `delta`; None when PLD does not apply to the mechanism."""
    raise NotImplementedError

  def rdp_copy(self) -> 'MechanismAccount':
    """An independent RDP-only copy, to compose a trial round into (`peek_epsilon`)."""
    raise NotImplementedError
