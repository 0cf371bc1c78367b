"""The DP mechanisms: one module each, and the registry that maps the `dp` setting's names to
them (`Mechanism`, `tff_dp.mechanisms.base`).

Everything that differs between mechanisms is declared by the mechanism's own module: its
noise, its samplers and so its claims, its settings and their checks, its aggregation factory
and, for correlated noise, its strategy. The rest of the package reads these declarations and
never branches on a mechanism's name (tests/test_mechanisms.py checks the syntax trees), so a
new mechanism is one module registered here, or `register`ed by its user.

Pure Python until a factory is built (then TensorFlow loads).
"""

import dataclasses
from typing import Optional

from tff_dp import choices
from tff_dp import errors
from tff_dp import noise_budget
from tff_dp import sampling
from tff_dp import sections
from tff_dp.accounting import claims
from tff_dp.accounting import noise_families
from tff_dp.adaptive_clipping import AdaptiveClipping
from tff_dp.mechanisms import adaptive
from tff_dp.mechanisms import bandmf
from tff_dp.mechanisms import blt
from tff_dp.mechanisms import fixed
from tff_dp.mechanisms import ftrl
from tff_dp.mechanisms import ftrl_adaptive
from tff_dp.mechanisms import joint
from tff_dp.mechanisms import per_layer_adaptive
from tff_dp.mechanisms.base import CORRELATED_ARGUMENTS
from tff_dp.mechanisms.base import FactoryRequest
from tff_dp.mechanisms.base import Mechanism

__all__ = ['CORRELATED_ARGUMENTS', 'FactoryRequest', 'DP_KINDS', 'MECHANISMS', 'NO_DP', 'Mechanism',
           'SAMPLER_CHOICES', 'build_aggregator', 'claim', 'find', 'get', 'register', 'with_noise',
           'with_setting']

NO_DP = 'none'   # The `dp` setting of plain FedAvg: no mechanism.
MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (
    fixed.MECHANISM, adaptive.MECHANISM, per_layer_adaptive.MECHANISM, joint.MECHANISM,
    ftrl.MECHANISM, ftrl_adaptive.MECHANISM, blt.MECHANISM, bandmf.MECHANISM)}


def _dp_meaning(name: str) -> str:
  return 'plain FedAvg, no DP' if name == NO_DP else MECHANISMS[name].description


def _sampler_meaning(name: str) -> str:
  taking = [n for n, m in MECHANISMS.items() if name in m.samplers]
  return sampling.CHOICES[name] + (f' (`dp={"|".join(taking)}`)' if taking else '')


# The `dp` setting's choices, name -> meaning: 'none' and every registered mechanism.
DP_KINDS = choices.LiveChoices(lambda: [NO_DP, *MECHANISMS], _dp_meaning)
# The `client_sampling` setting's choices, name -> meaning and the mechanisms that take it
# (`dp=a|b`), from both registries.
SAMPLER_CHOICES = choices.LiveChoices(lambda: sampling.CHOICES, _sampler_meaning)


def _register_settings(mechanism: Mechanism) -> None:
  # Its settings' sections become config sections (flags, config.json keys); a section other
  # mechanisms list too is registered once.
  for section in mechanism.settings:
    sections.register(section)


for _mechanism in MECHANISMS.values():
  _register_settings(_mechanism)


def register(mechanism: Mechanism) -> None:
  """Makes `mechanism` a choice of the `dp` setting (its samplers' proofs were checked when it
  was built), and its settings' sections config sections; ValueError if the name is taken."""
  if mechanism.name in DP_KINDS:
    raise ValueError(f'a mechanism named {mechanism.name!r} is registered already')
  _register_settings(mechanism)
  MECHANISMS[mechanism.name] = mechanism


def get(name: str) -> Mechanism:
  """The registered mechanism `name` (UserInputError naming the choices otherwise)."""
  if name not in MECHANISMS:
    raise errors.UserInputError(f'`dp` must be one of {choices.one_of(MECHANISMS)} for a DP '
                                f'mechanism, got {name!r}')
  return MECHANISMS[name]


def find(kind: str) -> Optional[Mechanism]:
  """The mechanism of the `dp` setting `kind`: None for `NO_DP`, else as `get`."""
  return None if kind == NO_DP else get(kind)


def with_noise(noise: noise_families.NoiseFamily) -> list[str]:
  """The mechanisms whose noise is `noise` (a `tff_dp.accounting.noise_families` family)."""
  return [name for name, m in MECHANISMS.items() if m.noise is noise]


def with_setting(setting: str) -> list[str]:
  """The mechanisms that take `setting` as one of their own settings (`Mechanism.settings`)."""
  return [name for name, m in MECHANISMS.items()
          if any(setting in {f.name for f in dataclasses.fields(s)} for s in m.settings)]


def claim(name: str, sampler: str, probability_given: bool = False) -> claims.Claim:
  """The claim of mechanism `name` run with `sampler` (whose rate was given, or derived from
  the population: `claims.claim`): its noise's row of the claim table, when the mechanism
  lists the sampler; UserInputError (one line) otherwise."""
  mechanism = get(name)
  try:   # An unproven pair is refused here.
    found = claims.claim(mechanism.noise.name, sampler, probability_given)
  except errors.UserInputError as e:
    having = [n for n, m in MECHANISMS.items()
              if sampler in m.samplers and sampler in claims.proven_samplers(m.noise.name)]
    if not having or (probability_given and sampler not in sampling.with_rate()):
      raise   # No mechanism to point to, or the sampler has no rate to give.
    raise errors.UserInputError(f'{e}, or `dp={"|".join(having)}` (proven with it)') from None
  if sampler not in mechanism.samplers:
    covered = [n for n in with_noise(mechanism.noise) if sampler in MECHANISMS[n].samplers]
    proven = f'has a proof for {choices.one_of(covered)} only' if covered else 'has no proof'
    instead = f'`dp={covered[0]}`, or ' if covered else ''
    raise errors.UserInputError(
        f'`client_sampling={sampler}` {proven} (`dp={name}` has no analysis of it); use '
        f'{instead}`client_sampling={mechanism.default_sampler}`')
  return found


def build_aggregator(kind: str, *, noise_multiplier: float, clients_per_round: float,
                     clip: float, adaptive: AdaptiveClipping = AdaptiveClipping(),
                     noise_allocation: str = 'proportional', **kwargs):
  """The aggregation factory of mechanism `kind` (`clip` is the initial clip, or the initial
  scale alpha for joint; `adaptive`: how a mechanism that adapts its clip adapts it).

  Further keyword arguments are the mechanism's own (`Mechanism.extra_arguments`): `groups`
  (per_layer_adaptive, joint, with joint's `joint_clip`, `adaptive_scales`), the tree's
  `rounds_per_epoch`, `noise_seed` (ftrl_adaptive: also `restart_warmup`,
  `restart_frequency`), correlated noise's schedule (`rounds`, `min_separation`,
  `max_participations`, `bands`, `noise_seed`, `amplified`); anything else is a
  UserInputError. ftrl_adaptive adapts geometrically (as TFF); the tree and correlated
  factories use no `noise_allocation`.
  """
  if kind not in MECHANISMS:
    raise errors.UserInputError(f'unknown DP aggregation kind {kind!r}; choose one of '
                                f'{", ".join(MECHANISMS)}')
  mechanism = MECHANISMS[kind]
  noise_budget.check_noise_allocation(noise_allocation)
  allowed: Optional[tuple] = mechanism.extra_arguments
  unknown = sorted(set(kwargs) - set(allowed)) if allowed is not None else []
  if unknown:
    raise errors.UserInputError(f'DP aggregation kind {kind!r} does not take '
                                f'{", ".join(unknown)}'
                                + (f' (it takes {", ".join(allowed)})' if allowed else ''))
  return mechanism.factory(FactoryRequest(
      clip=clip, noise_multiplier=noise_multiplier, clients_per_round=clients_per_round,
      adaptive=adaptive, noise_allocation=noise_allocation, own=kwargs))
