"""The claim table: for each (noise, sampler) pair the package runs, the neighbouring relation
its epsilon is proven under, the theorem it rests on, and the test that attacks it.

A run never chooses its relation beside its mechanism: the accountant, the privacy statement,
the calibration and the accounting CLI all read it here from what ran (the kind of noise, the
sampler, where its rate came from, whether the sample is seeded). A pair missing from the
table has no proof and is refused before anything is written, with one line saying what to
use instead.

Relations (dp_accounting's `NeighboringRelation`):
  * 'add_remove': neighbouring datasets differ by one client's presence.
  * 'replace_one': one client's data replaced by another client's.
  * 'replace_special' (zero-out): one client's data replaced by a special client that
    contributes nothing; the population (and so every client's place in the schedule) is the
    same on both sides.

Every input of a release other than the clients' data must be fixed before the data is seen
for an add/remove claim. The Poisson samplers' rate q is either given (`sampling_probability`,
recorded as `SamplingEvent.probability_given`: add/remove) or derived from the population
(q = m / N: a neighbour with one client more would run with another q, so zero-out, whose
neighbours share N; the same epsilon, `Claim.rate`).

Samplers that fill fixed-size blocks of a permutation (shuffled, min_separation) support
zero-out only: adding a client shifts every later client of the permutation into another
block, so one added client changes many rounds' sums (the attack in tests/test_claims.py).

A seeded sample is known to whoever holds the seed: an `amplified` claim (its epsilon uses
amplification by sampling) then headlines the epsilon without amplification
(`tff_dp.accounting.guarantee.without_amplification`); a claim without amplification holds
against the seed holder as it is. Samplers key every draw on client ids, never on positions
(`tff_dp.sampling`), so a seeded sample of the other clients is the same on both sides of an
add/remove pair.

Pure Python: the configuration checks import it without TensorFlow.
"""

import dataclasses
from typing import Optional, Sequence

from tff_dp import errors
from tff_dp import sampling
from tff_dp.accounting import noise_family

ZERO_OUT = 'replace_special'
RELATIONS = ('add_remove', 'replace_one', ZERO_OUT)
# How each relation reads in a statement and in docs/PRIVACY.md.
RELATION_NAMES = {'add_remove': 'add/remove-one', 'replace_one': 'replace-one',
                  ZERO_OUT: 'zero-out (replace-special)'}


# Where a row's sampling rate comes from (the claim table's `rate` column, docs/PRIVACY.md).
RATE_GIVEN = 'given'           # `sampling_probability`: fixed before the data is seen.
RATE_FROM_POPULATION = 'm / N'  # Derived from the population: a neighbour's N moves it.
RATE_NONE = 'none'             # No rate: m clients a round, N the same on both sides.


@dataclasses.dataclass(frozen=True)
class Claim:
  """What a (noise, sampler, rate) row's epsilon is proven under.

  noise: the mechanism's kind of noise ('independent', 'tree', 'correlated';
    `tff_dp.mechanisms.Mechanism.noise`).
  sampler: a `tff_dp.sampling.KINDS` name.
  relation: the neighbouring relation of the headline epsilon.
  proof: the theorem the headline rests on.
  amplified: whether the epsilon uses amplification by sampling (then a seed holder gets the
    epsilon without it).
  attack: the test of tests/test_claims.py that builds this pair's worst-case neighbours.
  per_round_relation: the relation of the per-round epsilon_* columns, when it differs from
    `relation` (fixed-size sampling's columns are the Poisson approximation under add/remove,
    labelled as one, never the headline).
  rate: where the sampling rate q comes from (`RATE_GIVEN`, `RATE_FROM_POPULATION`,
    `RATE_NONE`). Every input of the release other than the clients' data must be fixed
    before the data is seen for an add/remove claim: a q computed from the population
    differs between neighbours that differ in one client, so such a row claims zero-out,
    whose neighbours share the population (and q), and whose pair of outputs is then exactly
    the add/remove pair of the theorem at that q (the zeroed client is drawn as before and
    contributes nothing). The epsilon is the same number.

  Which mechanisms of `noise` a row covers is each mechanism's declaration (its `samplers`,
  `tff_dp.mechanisms`): amplified BandMF's row covers banded strategies only.
  """
  noise: str
  sampler: str
  relation: str
  proof: str
  amplified: bool
  attack: str
  per_round_relation: Optional[str] = None
  rate: str = RATE_NONE

  @property
  def columns_relation(self) -> str:
    """The relation the run's per-round accountant (its epsilon_* columns) uses."""
    return self.per_round_relation or self.relation

  @property
  def rate_given(self) -> bool:
    return self.rate == RATE_GIVEN


_POISSON_PROOF = ('Poisson-subsampled Gaussian: Mironov, Talwar & Zhang 2019 (RDP); Zhu, Dong '
                  '& Wang 2022 (PLD), via dp_accounting PoissonSampledDpEvent')
_ZERO_OUT_AT_Q = ('; zero-out (Kairouz et al. 2021, Definition 1.1) at q = m / N, the same q '
                  'on both sides, whose pair of outputs is the add/remove pair at that q')
_AMPLIFIED_BANDMF_PROOF = (
    'amplified BandMF: Choquette-Choo et al. 2023, "(Amplified) Banded Matrix '
    'Factorization", Theorem 4, with every client drawing its group independently (so '
    'adding a client moves no other; jax_privacy PartitionType.INDEPENDENT)')

# The family whose rounds `events` composes as sampled Gaussians on the recorded sample.
INDEPENDENT_NOISE = 'independent'
CLAIMS = [   # The built-in rows; `register` adds a registered family's.
    Claim('independent', 'poisson', 'add_remove', _POISSON_PROOF,
          amplified=True, attack='test_poisson_add_remove', rate=RATE_GIVEN),
    Claim('independent', 'poisson', ZERO_OUT, _POISSON_PROOF + _ZERO_OUT_AT_Q,
          amplified=True, attack='test_poisson_zero_out', rate=RATE_FROM_POPULATION),
    Claim('independent', 'fixed_size', 'replace_one',
          'sampling without replacement: Wang, Balle & Kasiviswanathan 2019 (RDP), via '
          'dp_accounting SampledWithoutReplacementDpEvent',
          amplified=True, attack='test_fixed_size_replace_one',
          per_round_relation='add_remove'),
    Claim('tree', 'shuffled', ZERO_OUT,
          'DP-FTRL tree aggregation without sampling: Kairouz et al. 2021 (Definition 1.1), one '
          'SingleEpochTreeAggregationDpEvent per epoch',
          amplified=False, attack='test_tree_shuffled_zero_out'),
    Claim('correlated', 'min_separation', ZERO_OUT,
          'matrix mechanism under b-min-separation participation: Choquette-Choo et al. 2023, '
          '"Multi-Epoch Matrix Factorization Mechanisms" (sensitivity under min separation), '
          'one Gaussian mechanism over the run',
          amplified=False, attack='test_min_separation_zero_out'),
    Claim('correlated', 'cyclic_poisson', 'add_remove', _AMPLIFIED_BANDMF_PROOF,
          amplified=True, attack='test_cyclic_poisson_add_remove', rate=RATE_GIVEN),
    Claim('correlated', 'cyclic_poisson', ZERO_OUT,
          _AMPLIFIED_BANDMF_PROOF + _ZERO_OUT_AT_Q.replace('m / N', 'm x groups / N'),
          amplified=True, attack='test_cyclic_poisson_zero_out', rate=RATE_FROM_POPULATION),
]


def _check_row(row: Claim) -> None:
  """ValueError for a row its sampler's declaration contradicts: a rate exactly when the
  sampler draws with one, and for independent noise the sampler's event of it (which
  `events` composes)."""
  declared = sampling.get(row.sampler)
  if (row.rate != RATE_NONE) != declared.with_rate:
    raise ValueError(f'claim row whose rate disagrees with its sampler: {row}')
  if row.noise == INDEPENDENT_NOISE and declared.independent_event is None:
    raise ValueError(f'claim row of independent noise whose sampler declares no '
                     f'independent_event: {row}')


for _row in CLAIMS:
  _check_row(_row)
_BY_ROW = {(c.noise, c.sampler, c.rate_given): c for c in CLAIMS}


def register(row: Claim) -> None:
  """Adds a proven (noise, sampler, rate) row: a registered noise family's claim
  (`noise_family.register`), its proof named and its attack a test of the registering code;
  ValueError if the table has that row already or its rate disagrees with its sampler."""
  _check_row(row)
  key = (row.noise, row.sampler, row.rate_given)
  if key in _BY_ROW:
    raise ValueError(f'the claim table has a row for {key} already')
  CLAIMS.append(row)
  _BY_ROW[key] = row


def proven_samplers(noise: str) -> list[str]:
  """The samplers with a row for `noise`, in the table's order (the first is the one to use)."""
  return list(dict.fromkeys(c.sampler for c in CLAIMS if c.noise == noise))


def _unproven(noise: str, sampler: str) -> str:
  """The one line refusing an unproven pair, saying what to use instead."""
  family = noise_family.get(noise)   # Mechanism names are `mechanisms.claim`'s to add.
  return (f'{family.title} has no proof with {sampler} sampling ({family.unproven_because}); use '
          f'`client_sampling={proven_samplers(noise)[0]}`')


def claim(noise: str, sampler: str, probability_given: bool = False) -> Claim:
  """The claim of `noise` with `sampler`, whose rate (Poisson kinds) was given before the data
  was seen or derived from the population (`probability_given`); UserInputError (one line)
  for an unproven pair."""
  if probability_given and not sampling.get(sampler).with_rate:
    raise errors.UserInputError(f'{sampling.get(sampler).title} sampling has no rate '
                                'to give (`sampling_probability` is for '
                                f'{sampling.titles(sampling.with_rate())} '
                                'sampling)')
  found = _BY_ROW.get((noise, sampler, bool(probability_given)))
  if found is None and sampler in proven_samplers(noise):   # A row for the other rate.
    raise errors.UserInputError(
        f'{noise_family.get(noise).title} with {sampler} sampling is proven only when its rate '
        + ('is derived from the population (no `sampling_probability`)' if probability_given
           else 'is given before the data is seen (`sampling_probability`)'))
  if found is None:
    raise errors.UserInputError(_unproven(noise, sampler))
  return found


def check_proven(noise: str, sampler: str) -> None:
  """UserInputError (one line saying what to use) unless the table has a row for `noise` with
  `sampler`, at either rate (which rate a run has is its claim's to check, `claim`)."""
  if sampler not in proven_samplers(noise):
    claim(noise, sampler)


def noise_of_record(record) -> str:
  """The name of a ledger record's noise family: the one it names (`RoundRecord.noise`), or
  the built-in one its shape tells: 'tree' (a tree leaf), 'correlated' (a strategy) or
  'independent'."""
  if record.noise is not None:
    return record.noise
  if record.tree_leaf is not None:
    return 'tree'
  return 'correlated' if record.correlated is not None else 'independent'


def claim_of_record(record) -> Claim:
  """The claim of one ledger record: its noise, its sampler and where its rate came from."""
  return claim(noise_of_record(record), record.sampling.kind,
               record.sampling.probability_given)


def claim_for_records(records: Sequence) -> Optional[Claim]:
  """The claim of a ledger (its first record's); None for an empty one."""
  return claim_of_record(records[0]) if records else None


def check_relation(found: Claim, relation: str) -> None:
  """UserInputError unless `relation` is one the claim's proof (or its labelled per-round
  approximation) supports: asking for another relation would print an unproven number."""
  if relation not in (found.relation, found.columns_relation):
    hint = (' (its rate q was derived from the population, which a neighbour with one client '
            'more or fewer changes; a run that gives `sampling_probability` claims add/remove)'
            if found.rate == RATE_FROM_POPULATION and relation == 'add_remove' else '')
    raise errors.UserInputError(
        f'{sampling.get(found.sampler).title} sampling with {found.noise} noise is proven under '
        f'{found.relation} ({RELATION_NAMES[found.relation]}) only, not {relation}{hint}; '
        f'account it under {found.relation}.')
