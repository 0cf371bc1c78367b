"""What a kind of noise is (`NoiseFamily`), and the registry of the kinds: one declaration each,
beside the account that composes its rounds.

A family declares what the rest of the package would otherwise branch on by its name: how
refusals and the privacy statement name it, the account its ledger records are composed by,
what a run of it must never do (re-execute a released round when its noise state spans
rounds), whether its noise is planned for the run's rounds, and what its factory takes from
the sampler's schedule. The built-in families are declared by their accounts
(`gaussian_rounds`, `tree_rounds`, `correlated_rounds`) and collected by `noise_families`;
this module sits below them and the claim table, which reads a family's refusal text here.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional

from tff_dp import errors
from tff_dp.accounting import mechanism_account

# (cycle, total_rounds, own settings, amplified) -> the factory's keyword arguments that follow
# the sampler's schedule (`NoiseFamily.schedule`).
ScheduleArguments = Callable[[int, int, Mapping[str, Any], bool], dict]


@dataclasses.dataclass(frozen=True)
class NoiseFamily:
  """A kind of noise.

  name: its key in the claim table (`tff_dp.accounting.claims`) and in ledger records that
    name it. title: how a refusal names it.
  unproven_because: why a sampler without a claim row has no proof for it.
  statement: the privacy statement's line for a run of mechanism `{dp}`.
  account: the `MechanismAccount` subclass that composes its ledger records.
  carries_state: its noise state spans rounds (a tree's nodes, a strategy's buffers), so a
    round whose output was released is never executed again: every round is checkpointed,
    and re-executing released rounds is refused.
  planned_for_rounds: its noise is planned for the run's number of rounds and participation
    schedule, which are then checked before the run and fixed at resume.
  records_tree_leaf: each round's record names its tree leaf (round 1: leaf 1).
  noise_in_round_queries: a round's noise is its reported Gaussian queries alone, so their
    multipliers must add up to the factory's (`tff_dp.privacy.PrivateAggregation.record`).
  schedule_arguments: how its factory follows the sampler's schedule (`schedule`); None: it
    does not.
  named_in_records: its ledger records carry its name (`RoundRecord.noise`). The built-in
    families' records are told apart by their shape instead (a tree leaf, a strategy, plain
    queries), which keeps the ledgers they wrote unchanged.
  """
  name: str
  title: str
  unproven_because: str
  statement: str
  account: type
  carries_state: bool = False
  planned_for_rounds: bool = False
  records_tree_leaf: bool = False
  noise_in_round_queries: bool = False
  schedule_arguments: Optional[ScheduleArguments] = None
  named_in_records: bool = True

  def __post_init__(self):
    if not (isinstance(self.account, type)
            and issubclass(self.account, mechanism_account.MechanismAccount)):
      raise ValueError(f'noise family {self.name!r}: account must be a MechanismAccount '
                       f'subclass, got {self.account!r}')

  @property
  def rounds_per_checkpoint(self) -> int:
    """The default checkpoint period: every round when the noise carries state."""
    return 1 if self.carries_state else 10

  @property
  def recorded_name(self) -> Optional[str]:
    """What its ledger records carry as `noise` (None: their shape tells)."""
    return self.name if self.named_in_records else None

  def schedule(self, cycle: int, total_rounds: int, own: Mapping[str, Any],
               amplified: bool = False) -> dict:
    """The factory's keyword arguments that follow the sampler's schedule: its `cycle` (the
    sampler's rounds per epoch), the run's `total_rounds`, the mechanism's `own` settings and
    whether the sampler is `amplified` (grouped); {} for noise that does not follow it."""
    if self.schedule_arguments is None:
      return {}
    return self.schedule_arguments(cycle, total_rounds, own, amplified)


FAMILIES: dict[str, NoiseFamily] = {}


def register(family: NoiseFamily) -> NoiseFamily:
  """Makes `family` a kind of noise mechanisms may declare (returned, for a module constant);
  ValueError if another family has its name (registering the same one again does nothing)."""
  if not isinstance(family, NoiseFamily):
    raise ValueError(f'register takes a NoiseFamily, got {family!r}')
  if FAMILIES.get(family.name, family) is not family:
    raise ValueError(f'a noise family named {family.name!r} is registered already')
  FAMILIES[family.name] = family
  return family


def get(name: str) -> NoiseFamily:
  """The family called `name` (UserInputError naming the families otherwise)."""
  if name not in FAMILIES:
    raise errors.UserInputError(f'noise must be one of {tuple(FAMILIES)}, got {name!r}')
  return FAMILIES[name]
