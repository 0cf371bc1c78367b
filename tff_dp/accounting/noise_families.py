"""The kinds of noise a mechanism adds (`NoiseFamily`): what each is called, what a run of it
must never do, and what the privacy statement says of it, in one declaration each.

A family's accountant is the ledger's records' (`tff_dp.accounting.accountant`: independent
Gaussian rounds, tree epochs, one correlated mechanism over the run) and its proven samplers
are the claim table's rows for its name (`tff_dp.accounting.claims`); a mechanism names its
family (`tff_dp.mechanisms.Mechanism.noise` is the family itself).
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional

from tff_dp import errors
from tff_dp.accounting import correlated

# (cycle, total_rounds, own settings, amplified) -> the factory's keyword arguments that follow
# the sampler's schedule (`NoiseFamily.schedule`).
ScheduleArguments = Callable[[int, int, Mapping[str, Any], bool], dict]


@dataclasses.dataclass(frozen=True)
class NoiseFamily:
  """A kind of noise.

  name: its key in the claim table and in `Mechanism.noise`. title: how a refusal names it.
  unproven_because: why a sampler without a claim row has no proof for it.
  statement: the privacy statement's line for a run of mechanism `{dp}`.
  carries_state: its noise state spans rounds (a tree's nodes, a strategy's buffers), so a
  round whose output was released is never executed again: every round is checkpointed, and
  re-executing released rounds is refused. planned_for_rounds: its noise is planned for the
  run's number of rounds and participation schedule, which are then checked before the run and
  fixed at resume.
  records_tree_leaf: each round's record names its tree leaf (round 1: leaf 1), which is how
  the ledger's accountant tells the tree's rounds from others.
  noise_in_round_queries: a round's noise is its reported Gaussian queries alone, so their
  multipliers must add up to the factory's (`tff_dp.privacy.PrivateAggregation.record` checks).
  schedule_arguments: how its factory follows the sampler's schedule (`schedule`); None: it
  does not.
  """
  name: str
  title: str
  unproven_because: str
  statement: str
  carries_state: bool = False
  planned_for_rounds: bool = False
  records_tree_leaf: bool = False
  noise_in_round_queries: bool = False
  schedule_arguments: Optional[ScheduleArguments] = None

  @property
  def rounds_per_checkpoint(self) -> int:
    """The default checkpoint period: every round when the noise carries state."""
    return 1 if self.carries_state else 10

  def schedule(self, cycle: int, total_rounds: int, own: Mapping[str, Any],
               amplified: bool = False) -> dict:
    """The factory's keyword arguments that follow the sampler's schedule: its `cycle` (the
    sampler's rounds per epoch), the run's `total_rounds`, the mechanism's `own` settings and
    whether the sampler is `amplified` (grouped); {} for noise that does not follow it."""
    if self.schedule_arguments is None:
      return {}
    return self.schedule_arguments(cycle, total_rounds, own, amplified)


def _epoch(cycle, total_rounds, own, amplified) -> dict:
  # The tree restarts every epoch of the shuffled sampler.
  del total_rounds, own, amplified
  return {'rounds_per_epoch': cycle}


def _planned(cycle, total_rounds, own, amplified) -> dict:
  # A strategy is planned for the run's rounds and the sampler's participation schedule.
  return dict(correlated.planned_schedule(own, cycle, total_rounds), amplified=amplified)


INDEPENDENT = NoiseFamily(
    name='independent', title='independent Gaussian noise',
    unproven_because='its amplification of this noise is not analysed',
    statement='DP-FedAvg ({dp} clipping, Gaussian noise), as recorded in ledger.jsonl',
    noise_in_round_queries=True)
TREE = NoiseFamily(
    name='tree', title='tree-aggregation noise (DP-FTRL)',
    unproven_because='a client could be in several rounds of one tree',
    statement='DP-FTRL ({dp}: tree-aggregation noise), as recorded in ledger.jsonl',
    carries_state=True, records_tree_leaf=True, schedule_arguments=_epoch)
CORRELATED = NoiseFamily(
    name='correlated', title='correlated noise',
    unproven_because='no analysis of its participation',
    statement=('DP-FTRL ({dp}: correlated noise, fixed clip), the strategy and schedule as '
               'recorded in ledger.jsonl (`correlated`: buf_decay / output_scale, bands or '
               'coefs, min_separation, max_participations)'),
    carries_state=True, planned_for_rounds=True, schedule_arguments=_planned)

FAMILIES = {family.name: family for family in (INDEPENDENT, TREE, CORRELATED)}


def get(name: str) -> NoiseFamily:
  """The family called `name` (UserInputError naming the families otherwise)."""
  if name not in FAMILIES:
    raise errors.UserInputError(f'noise must be one of {tuple(FAMILIES)}, got {name!r}')
  return FAMILIES[name]
