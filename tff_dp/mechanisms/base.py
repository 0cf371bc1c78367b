"""What a DP mechanism of the package is: one frozen `Mechanism` per module of this package.

A mechanism declares what the rest of the package would otherwise branch on by its name: the
kind of noise it adds (which decides its accountant and its claim rows), whether it adapts its
clip, the samplers its proofs cover, the settings that are its own, and how its aggregation
factory and (correlated noise) its strategy are built. Pure Python: the configuration checks a
mechanism's settings before TensorFlow loads; its factory imports TensorFlow when it is built.
"""

import dataclasses
from typing import Any, Callable, Mapping, Optional

from tff_dp import errors
from tff_dp import sampling
from tff_dp import sections
from tff_dp.adaptive_clipping import AdaptiveClipping
from tff_dp.accounting import claims
from tff_dp.accounting import correlated
from tff_dp.accounting import noise_families


@dataclasses.dataclass(frozen=True, kw_only=True)
class FactoryRequest:
  """Everything a mechanism's aggregation factory is built from, each input by name
  (`Mechanism.build_factory(request)`; `tff_dp.mechanisms.build_aggregator` checks it).

  clip: the initial L2 clip of a client's update (joint: the initial scale alpha).
  noise_multiplier: the update query's noise stddev over its clip (the round's whole budget
    where the clip adapts: `tff_dp.noise_budget`).
  clients_per_round: the expected clients of a round, the mean's denominator.
  adaptive: how an adaptive clip follows the update norms.
  noise_allocation: how grouped clipping splits the noise between groups.
  own: the mechanism's own keyword arguments (`Mechanism.extra_arguments`: the groups, the
    tree's `rounds_per_epoch`, correlated noise's schedule, ...).
  """
  clip: float
  noise_multiplier: float
  clients_per_round: float
  adaptive: AdaptiveClipping = AdaptiveClipping()
  noise_allocation: str = 'proportional'
  own: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Mechanism:
  """A DP mechanism: clipping, noise and the claims its proofs support.

  name: the value of the `dp` setting that selects it.
  description: one line, for help texts and docs.
  noise: its kind of noise (`tff_dp.accounting.noise_families`): `INDEPENDENT` (fresh
    Gaussian noise every round), `TREE` (tree aggregation, DP-FTRL) or `CORRELATED` (a
    Toeplitz strategy's noise, correlated across rounds), or a family `register`ed there with
    its account and its claim rows (`claims.register`).
  samplers: the `client_sampling` values its claims cover, its default first; each must have a
    row of the claim table (`tff_dp.accounting.claims`) for its noise.
  build_factory: (a `FactoryRequest`) -> its `tff.aggregators.UnweightedAggregationFactory`.
    None for correlated noise: the correlated-noise factory streams its strategy
    (`factory`).
  extra_arguments: the further keyword arguments its factory takes (None: any, checked by the
    factory itself).
  adapts_clip: whether it adapts a clip with noised clipped-count queries (whose noise is part
    of the round's budget, `tff_dp.noise_budget.update_noise_multiplier`).
  settings: the config sections of its own settings (`tff_dp.sections.Section` classes, each
    with its checks; others may list the same section): registered with the mechanism, they
    are flags and config.json keys, refused with a mechanism that does not list them.
  strategy_coefs: correlated noise only: (rounds, min_separation, max_participations, bands,
    max_buffers) -> (Toeplitz coefficients, their parameters: a BLT's `buf_decay` and
    `output_scale`, a banded strategy's `bands`, or {} for any other strategy, whose
    coefficients the ledger then records themselves).
  """
  name: str
  description: str
  noise: noise_families.NoiseFamily
  samplers: tuple
  build_factory: Optional[Callable[..., Any]] = None
  extra_arguments: Optional[tuple] = ()
  adapts_clip: bool = False
  settings: tuple = ()
  strategy_coefs: Optional[Callable[..., tuple]] = None

  def __post_init__(self):
    if not isinstance(self.noise, noise_families.NoiseFamily):
      raise ValueError(f'Mechanism {self.name!r}: noise must be a NoiseFamily '
                       f'(tff_dp.accounting.noise_families), got {self.noise!r}')
    if not self.samplers:
      raise ValueError(f'Mechanism {self.name!r} lists no sampler')
    for sampler in self.samplers:   # A sampler without a proof is refused here.
      claims.check_proven(self.noise.name, sampler)
    if self.noise.planned_for_rounds != (self.strategy_coefs is not None):
      raise ValueError(f'Mechanism {self.name!r}: noise planned for the rounds (correlated), '
                       'and only it, has a strategy')
    if self.build_factory is None and not self.noise.planned_for_rounds:
      raise ValueError(f'Mechanism {self.name!r} has no factory')
    for section in self.settings:
      if not (isinstance(section, type) and issubclass(section, sections.Section)
              and section.SECTION):
        raise ValueError(f'Mechanism {self.name!r}: its settings must be named config '
                         f'sections (tff_dp.sections.Section), got {section!r}')

  def factory(self, request: FactoryRequest):
    """Its aggregation factory for `request` (`tff_dp.mechanisms.build_aggregator` checks it)."""
    if self.build_factory is None:
      return correlated_factory(self, request)
    return self.build_factory(request)

  @property
  def default_sampler(self) -> str:
    return self.samplers[0]

  @property
  def amplified_by_groups(self) -> bool:
    """Whether it takes a grouped sampler (amplified BandMF's cyclic Poisson)."""
    return any(sampling.get(s).grouped for s in self.samplers)

  def strategy(self, rounds: int, min_separation: int, max_participations: int, *,
               bands: Optional[int] = None, max_buffers: int = 4,
               amplified: bool = False) -> correlated.Strategy:
    """Its correlated-noise strategy for the schedule (`tff_dp.accounting.correlated`).
    `amplified`: cyclic Poisson sampling over min_separation groups, a participation's
    sensitivity (only a banded strategy whose bands fit in the groups)."""
    if self.strategy_coefs is None:
      raise errors.UserInputError(f'`dp={self.name}` has no correlated-noise strategy')
    correlated.check_schedule(rounds, min_separation, max_participations)
    if amplified:
      if not self.amplified_by_groups:
        raise correlated.not_amplifiable(self.name)
      correlated.check_bands_within_groups(bands or min_separation, min_separation)
    coefs, params = self.strategy_coefs(rounds, min_separation, max_participations, bands,
                                         max_buffers)
    return correlated.strategy(self.name, coefs, params, rounds, min_separation,
                               max_participations, amplified=amplified)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorrelatedSchedule(sections.Section):
  """Correlated noise: the participation schedule its strategy is planned for."""
  SECTION = 'correlated_schedule'
  FOLLOWS = 'dp'
  min_separation: Optional[int] = sections.setting(
      None, '`dp=blt|bandmf`: the strategy is planned for clients at least this many rounds '
      'apart (default: the sampler\'s cycle, population // clients_per_round; at most that).',
      check=sections.at_least(1))
  max_participations: Optional[int] = sections.setting(
      None, '`dp=blt|bandmf`: ... and for at most this many participations of a client '
      '(default and minimum: what the rounds allow, ceil(total_rounds / cycle)).',
      check=sections.at_least(1))


# The keyword arguments of a correlated-noise factory: its schedule, and how its noise is drawn.
CORRELATED_ARGUMENTS = ('rounds', 'min_separation', 'max_participations', 'bands', 'noise_seed',
                        'amplified')


def correlated_factory(mechanism: Mechanism, request: FactoryRequest):
  """The factory of a correlated-noise `mechanism` for the schedule in `request.own`
  (`CORRELATED_ARGUMENTS`; rounds, min_separation and max_participations required): its
  strategy, the fresh draws scaled to the strategy's sensitivity."""
  from tff_dp.aggregators import correlated_noise  # pylint: disable=g-import-not-at-top
  own = request.own
  schedule = {name: own[name] for name in ('rounds', 'min_separation', 'max_participations')}
  found = mechanism.strategy(**schedule, bands=own.get('bands'),
                             amplified=own.get('amplified', False))
  return correlated_noise.CorrelatedNoiseFactory.for_strategy(
      found, **schedule, clip=request.clip, noise_seed=own.get('noise_seed'),
      noise_multiplier=request.noise_multiplier, clients_per_round=request.clients_per_round)
