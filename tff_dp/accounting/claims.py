"""The claim table: for each (noise, sampler) pair the package runs, the neighbouring relation
its epsilon is proven under, the theorem it rests on, and the test that attacks it.

A run never chooses its relation beside its mechanism: the accountant, the privacy statement,
the calibration and the accounting CLI all read it here from what ran (the kind of noise, the
sampler, whether the sample is seeded). A pair missing from the table has no proof and is
refused before anything is written, with one line saying what to use instead.

Relations (dp_accounting's `NeighboringRelation`):
  * 'add_remove': neighbouring datasets differ by one client's presence.
  * 'replace_one': one client's data replaced by another client's.
  * 'replace_special' (zero-out): one client's data replaced by a special client that
    contributes nothing; the population (and so every client's place in the schedule) is the
    same on both sides.

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

ZERO_OUT = 'replace_special'
RELATIONS = ('add_remove', 'replace_one', ZERO_OUT)
# How each relation reads in a statement and in docs/PRIVACY.md.
RELATION_NAMES = {'add_remove': 'add/remove-one', 'replace_one': 'replace-one',
                  ZERO_OUT: 'zero-out (replace-special)'}
# How messages and docs name each sampler.
SAMPLER_NAMES = {'poisson': 'Poisson', 'fixed_size': 'fixed-size', 'shuffled': 'shuffled',
                 'min_separation': 'min-separation', 'cyclic_poisson': 'cyclic Poisson'}


@dataclasses.dataclass(frozen=True)
class Claim:
  """What a (noise, sampler) pair's epsilon is proven under.

  noise: the mechanism's kind of noise ('independent', 'tree', 'correlated';
    `tff_dp.mechanisms.Mechanism.noise`).
  sampler: a `choices.CLIENT_SAMPLERS` name.
  relation: the neighbouring relation of the headline epsilon.
  proof: the theorem the headline rests on.
  amplified: whether the epsilon uses amplification by sampling (then a seed holder gets the
    epsilon without it).
  attack: the test of tests/test_claims.py that builds this pair's worst-case neighbours.
  per_round_relation: the relation of the per-round epsilon_* columns, when it differs from
    `relation` (fixed-size sampling's columns are the Poisson approximation under add/remove,
    labelled as one, never the headline).

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

  @property
  def columns_relation(self) -> str:
    """The relation the run's per-round accountant (its epsilon_* columns) uses."""
    return self.per_round_relation or self.relation


CLAIMS = (
    Claim('independent', 'poisson', 'add_remove',
          'Poisson-subsampled Gaussian: Mironov, Talwar & Zhang 2019 (RDP); Zhu, Dong & Wang '
          '2022 (PLD), via dp_accounting PoissonSampledDpEvent',
          amplified=True, attack='test_poisson_add_remove'),
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
    Claim('correlated', 'cyclic_poisson', 'add_remove',
          'amplified BandMF: Choquette-Choo et al. 2023, "(Amplified) Banded Matrix '
          'Factorization", Theorem 4, with every client drawing its group independently (so '
          'adding a client moves no other; jax_privacy PartitionType.INDEPENDENT)',
          amplified=True, attack='test_cyclic_poisson_add_remove'),
)
_BY_PAIR = {(c.noise, c.sampler): c for c in CLAIMS}


def _unproven(noise: str, sampler: str) -> str:
  """The one line refusing an unproven pair, saying what to use instead."""
  if noise == 'tree':
    return (f'tree-aggregation noise (DP-FTRL) has no proof with {sampler} sampling (a client '
            'could be in several rounds of one tree); use `client_sampling=shuffled`.')
  if noise == 'correlated':
    return (f'correlated noise (blt, bandmf) has no proof with {sampler} sampling (no analysis '
            'of its participation); use `client_sampling=min_separation`.')
  if sampler == 'shuffled':
    return ('shuffled participation has a proof for tree-aggregation noise only (no '
            'amplification analysis for independent Gaussian noise); use `dp=ftrl` or '
            '`dp=ftrl_adaptive`, or `client_sampling=poisson`.')
  kinds = '`dp=bandmf`' if sampler == 'cyclic_poisson' else '`dp=blt` or `dp=bandmf`'
  return (f'{sampler} participation has a proof for correlated noise only; use {kinds}, or '
          '`client_sampling=poisson`.')


def claim(noise: str, sampler: str) -> Claim:
  """The claim of `noise` with `sampler`; UserInputError (one line) for an unproven pair."""
  found = _BY_PAIR.get((noise, sampler))
  if found is None:
    raise errors.UserInputError(_unproven(noise, sampler))
  return found


def noise_of_record(record) -> str:
  """The kind of noise of a ledger record: 'tree', 'correlated' or 'independent'."""
  if record.tree_leaf is not None:
    return 'tree'
  return 'correlated' if record.correlated is not None else 'independent'


def claim_for_records(records: Sequence) -> Optional[Claim]:
  """The claim of a ledger (its first record's noise and sampler); None for an empty one."""
  if not records:
    return None
  return claim(noise_of_record(records[0]), records[0].sampling.kind)


def check_relation(found: Claim, relation: str) -> None:
  """UserInputError unless `relation` is one the claim's proof (or its labelled per-round
  approximation) supports: asking for another relation would print an unproven number."""
  if relation not in (found.relation, found.columns_relation):
    raise errors.UserInputError(
        f'{SAMPLER_NAMES[found.sampler]} sampling with {found.noise} noise is proven under '
        f'{found.relation} ({RELATION_NAMES[found.relation]}) only, not {relation}; account '
        f'it under {found.relation}.')
