"""Replaying a ledger after the run: its epsilon curve and its headline, verified under the
run's key when given (`python -m tff_dp.accounting --ledger`).

The headline is `guarantee.of_records`, the one a run's statement gives (the proven fixed-size
bound, the epsilon against a seed holder, or the accountant's), so a replay can state no other
figure than the run did. Without the key a MAC'd ledger is read unverified, and every line of
the replay says so: anyone who can write the file can recompute its checksums.
"""

import dataclasses
import os
from typing import Callable, Dict, List, Optional, Sequence

from tff_dp import errors
from tff_dp import ledger
from tff_dp.accounting import accountant
from tff_dp.accounting import claims
from tff_dp.accounting import guarantee

UNVERIFIED = 'UNVERIFIED'


@dataclasses.dataclass(frozen=True)
class Replay:
  """A ledger's replay.

  curve: [dict(round, epsilon_rdp, epsilon_pld)] of the per-round accountant under `relation`.
  headline: the run's guarantee (`guarantee.of_records`).
  relation: the relation of the curve.
  notes: what was not verified or not computed, each a sentence (the first starts with
    `UNVERIFIED` when the MACs were not checked).
  """
  curve: List[Dict[str, Optional[float]]]
  headline: guarantee.Headline
  relation: str
  notes: List[str]
  delta: float

  @property
  def verified(self) -> bool:
    return not (self.notes and self.notes[0].startswith(UNVERIFIED))

  def lines(self) -> List[str]:
    """What the CLI prints: '#' lines (notes, the headline, what the columns are), then CSV
    `round,epsilon_rdp,epsilon_pld`."""
    head = self.headline
    final = {m: self.curve[-1][f'epsilon_{m}'] for m in head.epsilon}
    out = [f'# {note}' for note in self.notes]
    out.append(f'# headline: {_epsilons(head.epsilon)} at delta={self.delta!r} under '
               f'{head.relation} ({claims.RELATION_NAMES[head.relation]}): {head.label}'
               + ('' if self.verified else ' [unverified]'))
    out.append(f'# columns: the per-round accountant under {self.relation}'
               + ('' if final == dict(head.epsilon) else ', not the headline'))
    out.append('round,epsilon_rdp,epsilon_pld')
    out += [f'{p["round"]},{_fmt(p["epsilon_rdp"])},{_fmt(p["epsilon_pld"])}'
            for p in self.curve]
    return out


def _fmt(x) -> str:
  return '' if x is None else repr(float(x))


def _epsilons(epsilons) -> str:
  return ' '.join(f'epsilon_{m}={_fmt(v) or "n/a"}' for m, v in epsilons.items())


def read_verified(path: str, mac_key: Optional[bytes] = None, seal_path: Optional[str] = None,
                  key_path: Optional[str] = None) -> tuple[list, List[str]]:
  """(the ledger's records, notes on what was not verified): under `mac_key` every line's
  chained MAC and the seal (`seal_path`, default `ledger.SEAL_FILE` beside `key_path`) are
  checked; without it a MAC'd ledger is read unverified, and said so."""
  macs = ledger.macs_of(path)
  if mac_key is None:
    notes = []
    if any(m.value for m in macs):
      notes.append(f'{UNVERIFIED}: this ledger carries MACs and no key was given, so nothing '
                   'shows it was not forged (edited with recomputed checksums, or cut short); '
                   'replay it with its key, the run\'s secret/ledger_key')
    return ledger.read_ledger(path), notes
  chained = any(m.chained for m in macs)
  if seal_path is None and chained and key_path is not None:
    seal_path = os.path.join(os.path.dirname(key_path), ledger.SEAL_FILE)
  notes = [] if seal_path is not None or chained else [
      'this ledger was written before seals: its lines are verified, but a ledger cut short '
      'cannot be told from a whole one']
  if chained and seal_path is None:
    raise errors.UserInputError(f'{path}: its lines are chained, so its seal is needed too '
                                '(the run\'s secret/ledger_seal)')
  return ledger.read_ledger(path, mac_key=mac_key, seal_path=seal_path), notes


def replay(path: str, delta: float, methods: Sequence[str] = accountant.METHODS, *,
           mac_key: Optional[bytes] = None, seal_path: Optional[str] = None,
           key_path: Optional[str] = None, relation: Optional[str] = None,
           pld_every: Optional[int] = None,
           progress: Optional[Callable[[int, int], None]] = None,
           pld_discretization: float = accountant.DEFAULT_PLD_DISCRETIZATION) -> Replay:
  """The replay of the ledger at `path` at `delta` (`read_verified` for the key arguments).

  relation: the curve's relation (default the claim's `columns_relation`; another the claim
    does not support is refused). Replace-one is RDP only (dp_accounting's PLD has no analysis
    of sampling without replacement), said in the notes.
  """
  records, notes = read_verified(path, mac_key, seal_path, key_path)
  if not records:
    raise errors.UserInputError(f'{path} holds no round: nothing to account.')
  found = claims.claim_for_records(records)
  relation = relation or found.columns_relation
  claims.check_relation(found, relation)
  methods = accountant.check_methods(methods)
  if relation == 'replace_one' and 'pld' in methods:
    methods = ('rdp',)
    notes.append('replace_one: RDP only (dp_accounting\'s PLD does not analyse sampling without '
                 'replacement); the epsilon_pld column is empty')
  curve = accountant.epsilon_curve(records, delta, methods, relation, pld_every=pld_every,
                                   progress=progress,
                                   pld_value_discretization_interval=pld_discretization)
  final = {m: curve[-1][f'epsilon_{m}'] for m in methods}
  head = guarantee.of_records(records, delta, methods,
                              epsilons=final if relation == found.columns_relation else None,
                              pld_value_discretization_interval=pld_discretization)
  return Replay(curve, head, relation, notes, delta)
