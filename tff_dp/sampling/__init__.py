"""Client samplers and their privacy-ledger events; the sample is secret unless seeded.

Each sampler is a module (`poisson`, `fixed_size`, `shuffled`, `min_separation`,
`cyclic_poisson`) that declares itself in a `SamplerKind` (`kind.py`): the rest of the package
reads the declarations through `KINDS` / `get`, never a sampler's name, and `register` adds
one (its ledger events included).

The amplification the accountant applies (q) assumes nobody but the mechanism knows which
clients a round used. The Poisson kinds' q is given (`build_sampler(probability=...)`, fixed
before the data is seen: the claim is add/remove) or derived from the population (q = m / N:
zero-out, `tff_dp.accounting.claims`); each sampler records which in its events. So that
nobody knows a sample, by default (`seed=None`) every round's draw comes from the operating
system's CSPRNG (`os.urandom`): nothing in the run's outputs, config or checkpoints lets
anyone recompute a sample, and a resumed run simply draws fresh samples for
the rounds it (re-)executes (each execution is its own ledger record). With an explicit
integer `seed`, round r's draw is a function of (seed, r, client id): reproducible simulations
and resume, but whoever holds the seed knows every round's membership (the run's privacy
statement says so).

Every draw is keyed on client ids, never on positions in the population list: a client's
seeded draws, its place in a keyed permutation and its cyclic-Poisson group are functions of
the key (or seed) and its own id. So adding or removing one client leaves every other
client's seeded draws and group unchanged (what the add/remove claims need against a seed
holder, `tff_dp.accounting.claims`), and a population other than the recorded one is caught by
its digest (`population_digest`) instead of silently reshuffling a schedule.

A sampler draws each round once: `sample(r)` called again for the same round (the loop
prefetches round r+1's clients while round r runs) returns the same clients.

Accounting each sampler maps to (see `tff_dp.accounting.accountant`):
  * `PoissonSampler` -> `PoissonSampledDpEvent(q, ...)`, exact under add/remove-one
    neighbouring (RDP and PLD). This is the sampling the DP-FedAvg analysis assumes.
  * `FixedSizeSampler` (uniform without replacement, like TFF's `build_uniform_sampling_fn`
    without replacement) -> `SampledWithoutReplacementDpEvent(N, m, ...)` under replace-one
    (RDP only, exact); under add/remove it is approximated as Poisson with q = m / N, the
    common DP-FedAvg practice (not a proven bound; prefer PoissonSampler for a rigorous
    add/remove guarantee).
  * `ShuffledSampler` (each epoch a fresh secret permutation, consecutive blocks) -> tree
    aggregation (DP-FTRL) only: `SingleEpochTreeAggregationDpEvent` per epoch under
    replace-special, which needs each client at most once per epoch and no amplification.
    Unlike the others it must draw the same permutation again when a resumed run re-executes
    rounds of an epoch (or clients would participate twice in it), so its randomness is a
    secret key (32 bytes from the OS unless seeded) that a run keeps beside its checkpoints.
  * `MinSeparationSampler` (one secret permutation, its blocks visited cyclically) ->
    correlated-noise DP-FTRL under zero-out (its blocks have a fixed size: an added client
    would shift others between rounds), and `CyclicPoissonSampler` (each client's group drawn
    independently from a secret key, the groups visited cyclically, Poisson within the group)
    -> amplified BandMF under add/remove (`tff_dp.accounting.correlated`); keys as
    `ShuffledSampler`'s. Which relation each pair is proven under is the claim table's
    (`tff_dp.accounting.claims`).
"""

from typing import Hashable, Optional, Sequence

from tff_dp import choices
from tff_dp import errors
from tff_dp import ledger
from tff_dp.sampling import cyclic_poisson
from tff_dp.sampling import fixed_size
from tff_dp.sampling import min_separation
from tff_dp.sampling import poisson
from tff_dp.sampling import shuffled
from tff_dp.sampling.base import KEY_BYTES
from tff_dp.sampling.base import Sampler
from tff_dp.sampling.base import check_population
from tff_dp.sampling.base import check_probability
from tff_dp.sampling.cyclic_poisson import CyclicPoissonSampler
from tff_dp.sampling.cyclic_poisson import probability as cyclic_poisson_probability
from tff_dp.sampling.fixed_size import FixedSizeSampler
from tff_dp.sampling.keys import check_holdout_count
from tff_dp.sampling.keys import hold_out
from tff_dp.sampling.keys import holdout_key
from tff_dp.sampling.keys import load_key
from tff_dp.sampling.keys import population_digest
from tff_dp.sampling.keys import save_key
from tff_dp.sampling.kind import SamplerKind
from tff_dp.sampling.kind import SamplerRequest
from tff_dp.sampling.min_separation import MinSeparationSampler
from tff_dp.sampling.permutation import rounds_per_epoch
from tff_dp.sampling.poisson import PoissonSampler
from tff_dp.sampling.shuffled import ShuffledSampler

# `client_sampling` -> its declaration (`SamplerKind`).
KINDS: dict[str, SamplerKind] = {}


def register(kind: SamplerKind) -> None:
  """Adds a sampler's declaration, and its events to the ledger's format (ValueError if its
  name is taken, or the ledger knows the kind with other fields)."""
  if kind.name in KINDS:
    raise ValueError(f'a sampler named {kind.name!r} is already registered')
  ledger.register_sampling_kind(kind.name, ledger.EventShape(
      probability=kind.with_rate, epoch=kind.keyed, groups=kind.grouped))
  KINDS[kind.name] = kind


for _module in (poisson, fixed_size, shuffled, min_separation, cyclic_poisson):
  register(_module.KIND)


# The `client_sampling` setting's choices, name -> meaning (a sampler registered later too).
CHOICES = choices.LiveChoices(lambda: KINDS, lambda name: KINDS[name].description)


def get(name: str) -> SamplerKind:
  """The declaration of `client_sampling=name`; UserInputError naming the choices."""
  if name not in KINDS:
    raise errors.UserInputError(f'`client_sampling` must be one of {choices.one_of(KINDS)}, '
                                f'got {name!r}')
  return KINDS[name]


def with_rate() -> tuple[str, ...]:
  """The samplers that include each client with a rate q (`sampling_probability`)."""
  return tuple(name for name, kind in KINDS.items() if kind.with_rate)


def titles(names: Sequence[str]) -> str:
  """'Poisson and cyclic Poisson': the samplers `names` as sentences name them."""
  return ' and '.join(get(name).title for name in names)


def _rate(kind: SamplerKind, population: int, clients_per_round: int, groups: Optional[int],
          probability: Optional[float]) -> tuple[Optional[float], bool]:
  """(q, whether it was given) of a kind with a rate: `probability` when given, else derived
  from the population so that a round samples `clients_per_round` clients on average."""
  if not kind.with_rate:
    if probability is not None:
      raise errors.UserInputError(f'`sampling_probability` is the rate of '
                                  f'{choices.one_of(with_rate())} sampling; '
                                  f'`client_sampling={kind.name}` draws `clients_per_round` '
                                  'clients')
    return None, False
  if probability is not None:
    return check_probability(probability), True
  if kind.grouped:
    return cyclic_poisson.probability(population, clients_per_round, groups), False
  return clients_per_round / population, False


def build_sampler(kind: str, client_ids: Sequence[Hashable], clients_per_round: int,
                  seed: Optional[int] = None, key: Optional[bytes] = None,
                  groups: Optional[int] = None,
                  probability: Optional[float] = None) -> Sampler:
  """The `kind` sampler (a `KINDS` name) of `clients_per_round` clients; `key`: a keyed
  sampler's secret key (None: a new one, unless `seed` is given); `groups`: a grouped
  sampler's number of groups (required by it, refused by the others); `probability`: the rate
  q of a sampler with one, fixed before the data is seen (then its claim is add/remove);
  None: q is derived from the population (zero-out)."""
  declared = get(kind)
  if declared.grouped != (groups is not None):
    raise errors.UserInputError(f'{declared.title} sampling needs its number of groups '
                                '(`bands`), and only it takes one' if declared.grouped else
                                f'{declared.title} sampling takes no number of groups')
  ids = check_population(client_ids)
  q, given = _rate(declared, len(ids), clients_per_round, groups, probability)
  return declared.build(SamplerRequest(ids, clients_per_round, seed=seed, key=key,
                                       groups=groups, probability=q, probability_given=given))
