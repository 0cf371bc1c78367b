"""The interface every kind of noise's accountant implements, in the style of dp_accounting's
`PrivacyAccountant` (`compose` / `get_epsilon`).

A `LedgerAccountant` composes a ledger through one `MechanismAccount`: the account its first
record's noise family declares (`noise_family.NoiseFamily.account`). Every later record must be
of the same family: one ledger holds one mechanism. A new kind of noise is a family with its
account (a subclass in its own module), never a branch elsewhere.
"""

from typing import Optional, Sequence

import numpy as np

from tff_dp import errors
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

  def compose(self, record: ledger.RoundRecord) -> None:
    """Adds one round; UserInputError (naming what to use) if it cannot be analysed."""
    raise NotImplementedError

  def rdp(self) -> np.ndarray:
    """The running RDP vector at `orders` (inf everywhere after a non-private round)."""
    raise NotImplementedError

  def epsilon_pld(self, delta: float) -> Optional[float]:
    """PLD epsilon at `delta`; None when PLD does not apply to the mechanism."""
    raise NotImplementedError

  def multiplier_without_amplification(self) -> float:
    """The noise multiplier of the one Gaussian the composed rounds are against someone who
    holds the sampling seed (knows every sample); a family without that analysis is refused
    when the sample was seeded."""
    raise errors.UserInputError(
        f'{self.name} has no analysis against a holder of the sampling seed: sample with a '
        'secret key (no `sampling_seed`)')

  def rdp_copy(self) -> 'MechanismAccount':
    """An independent RDP-only copy, to compose a trial round into (`peek_epsilon`)."""
    raise NotImplementedError
