"""Client samplers and their privacy-ledger events; the sample is secret unless seeded.

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
from tff_dp.sampling.base import KEY_BYTES
from tff_dp.sampling.base import Sampler
from tff_dp.sampling.base import check_population
from tff_dp.sampling.base import check_probability
from tff_dp.sampling.cyclic_poisson import CyclicPoissonSampler
from tff_dp.sampling.independent import FixedSizeSampler
from tff_dp.sampling.independent import PoissonSampler
from tff_dp.sampling.keys import check_holdout_count
from tff_dp.sampling.keys import hold_out
from tff_dp.sampling.keys import holdout_key
from tff_dp.sampling.keys import load_key
from tff_dp.sampling.keys import population_digest
from tff_dp.sampling.keys import save_key
from tff_dp.sampling.permutation import MinSeparationSampler
from tff_dp.sampling.permutation import ShuffledSampler
from tff_dp.sampling.permutation import rounds_per_epoch

# `client_sampling` -> the sampler of `clients_per_round` clients (its expected number for the
# Poisson kinds) from a population (`build_sampler`); the Poisson kinds also take their rate q
# and whether it was given (`_rate`).
_SAMPLERS = {
    'poisson': lambda ids, m, seed, key, groups, rate: PoissonSampler(
        ids, rate[0], seed=seed, probability_given=rate[1]),
    'fixed_size': lambda ids, m, seed, key, groups, rate: FixedSizeSampler(ids, m, seed=seed),
    'shuffled': lambda ids, m, seed, key, groups, rate: ShuffledSampler(
        ids, m, seed=seed, key=key),
    'min_separation': lambda ids, m, seed, key, groups, rate: MinSeparationSampler(
        ids, m, seed=seed, key=key),
    'cyclic_poisson': lambda ids, m, seed, key, groups, rate: CyclicPoissonSampler(
        ids, groups, rate[0], seed=seed, key=key, probability_given=rate[1]),
}

choices.check_implemented(choices.CLIENT_SAMPLERS, _SAMPLERS, 'tff_dp.sampling')

# The samplers that include each client with a rate q (`probability`).
WITH_PROBABILITY = ('poisson', 'cyclic_poisson')

def cyclic_poisson_probability(population: int, clients_per_round: int, groups: int) -> float:
  """q = clients_per_round x groups / population: a group's round then samples
  `clients_per_round` clients on average."""
  q = clients_per_round * groups / population
  if q > 1:
    raise errors.UserInputError(
        f'cyclic Poisson sampling of {clients_per_round} clients per round from {groups} '
        f'groups of a population of {population} needs q = {q:.3g} > 1; use fewer '
        '`clients_per_round` or fewer `bands`')
  return q

def _rate(kind: str, population: int, clients_per_round: int, groups: Optional[int],
          probability: Optional[float]) -> tuple[Optional[float], bool]:
  """(q, whether it was given) of a Poisson kind: `probability` when given, else derived from
  the population so that a round samples `clients_per_round` clients on average."""
  if kind not in WITH_PROBABILITY:
    if probability is not None:
      raise errors.UserInputError(f'`sampling_probability` is the rate of '
                                  f'{choices.one_of(WITH_PROBABILITY)} sampling; '
                                  f'`client_sampling={kind}` draws `clients_per_round` clients')
    return None, False
  if probability is not None:
    return check_probability(probability), True
  if kind == 'cyclic_poisson':
    return cyclic_poisson_probability(population, clients_per_round, groups), False
  return clients_per_round / population, False

def build_sampler(kind: str, client_ids: Sequence[Hashable], clients_per_round: int,
                  seed: Optional[int] = None, key: Optional[bytes] = None,
                  groups: Optional[int] = None,
                  probability: Optional[float] = None) -> Sampler:
  """The `kind` sampler (a `choices.CLIENT_SAMPLERS` name) of `clients_per_round` clients;
  `key`: the permutation samplers' secret key (None: a new one, unless `seed` is given);
  `groups`: cyclic Poisson's number of groups (required by it, refused by the others);
  `probability`: the Poisson kinds' rate q, fixed before the data is seen (then their claim
  is add/remove); None: q is derived from the population (zero-out)."""
  if kind not in _SAMPLERS:
    raise errors.UserInputError(f'`client_sampling` must be one of '
                                f'{choices.one_of(_SAMPLERS)}, got {kind!r}')
  if (kind == 'cyclic_poisson') != (groups is not None):
    raise errors.UserInputError('cyclic Poisson sampling needs its number of groups (`bands`), '
                                'and only it takes one')
  ids = check_population(client_ids)
  rate = _rate(kind, len(ids), clients_per_round, groups, probability)
  return _SAMPLERS[kind](ids, clients_per_round, seed, key, groups, rate)
