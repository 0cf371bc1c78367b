"""The kinds of noise a mechanism adds (`NoiseFamily`): what each is called, what a run of it
must never do, and what the privacy statement says of it, in one declaration each.

A family's accountant is the ledger's records' (`tff_dp.accounting.accountant`: independent
Gaussian rounds, tree epochs, one correlated mechanism over the run) and its proven samplers
are the claim table's rows for its name (`tff_dp.accounting.claims`); a mechanism names its
family (`tff_dp.mechanisms.Mechanism.noise`).
"""

import dataclasses

from tff_dp import errors


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
  """
  name: str
  title: str
  unproven_because: str
  statement: str
  carries_state: bool = False
  planned_for_rounds: bool = False

  @property
  def rounds_per_checkpoint(self) -> int:
    """The default checkpoint period: every round when the noise carries state."""
    return 1 if self.carries_state else 10


INDEPENDENT = NoiseFamily(
    name='independent', title='independent Gaussian noise',
    unproven_because='its amplification of this noise is not analysed',
    statement='DP-FedAvg ({dp} clipping, Gaussian noise), as recorded in ledger.jsonl')
TREE = NoiseFamily(
    name='tree', title='tree-aggregation noise (DP-FTRL)',
    unproven_because='a client could be in several rounds of one tree',
    statement='DP-FTRL ({dp}: tree-aggregation noise), as recorded in ledger.jsonl',
    carries_state=True)
CORRELATED = NoiseFamily(
    name='correlated', title='correlated noise',
    unproven_because='no analysis of its participation',
    statement=('DP-FTRL ({dp}: correlated noise, fixed clip), the strategy and schedule as '
               'recorded in ledger.jsonl (`correlated`: buf_decay / output_scale, bands or '
               'coefs, min_separation, max_participations)'),
    carries_state=True, planned_for_rounds=True)

FAMILIES = {family.name: family for family in (INDEPENDENT, TREE, CORRELATED)}


def get(name: str) -> NoiseFamily:
  """The family called `name` (UserInputError naming the families otherwise)."""
  if name not in FAMILIES:
    raise errors.UserInputError(f'noise must be one of {tuple(FAMILIES)}, got {name!r}')
  return FAMILIES[name]
