"""DP aggregation for your own TFF learning loop: the aggregator, the sampler, the ledger and the
accountant bound together, so that a pipeline goes from its loop to epsilon in a few lines:

    private = PrivateAggregation.build('blt', client_ids, clients_per_round=4, clip=1.0,
                                       noise_multiplier=1.0, rounds=6, delta=1e-3)
    process = tff.learning.algorithms.build_unweighted_fed_avg(
        model_fn, client_optimizer_fn, model_aggregator=private.aggregator)
    state = process.initialize()
    for r in range(1, 7):
      output = process.next(private.state_for(r, state),
                            [datasets[c] for c in private.sample(r)])
      state = output.state
      private.record(r, output.metrics)
    private.epsilon(), private.statement()

The sampler is the one the mechanism's claim is proven for (`accounting.claims`): Poisson for
DP-FedAvg kinds, shuffled epochs for tree DP-FTRL, min separation for BLT / BandMF (or cyclic
Poisson for amplified BandMF); another is refused unless the claim table has a proof for it.
Each round is recorded from what the aggregator itself reported (`privacy_queries`), appended
to a ledger when `ledger_path` is given, and accounted; the statement names the relation and
its theorem. `state_for` gives the state a round starts from: for BLT, BandMF and `ftrl`, with
the round's noise written into it (their noise state stays here, `aggregators.noise_feed`).
The samples are secret (OS randomness) unless `sampling_seed` is given, and then the
statement's headline is the epsilon against the seed holder.
"""

import dataclasses
import math
from typing import Any, Hashable, Optional, Sequence

from tff_dp import aggregators
from tff_dp import choices
from tff_dp import errors
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp import noise_budget
from tff_dp import sampling
from tff_dp.accounting import accountant as accountant_lib
from tff_dp.accounting import claims
from tff_dp.accounting import delta as delta_lib
from tff_dp.accounting import events
from tff_dp.accounting import guarantee as guarantee_lib
from tff_dp.aggregators import noise_feed


# How far, relative, a round's reported noise multiplier may be from the factory's: float32
# (S, sigma) tuples differ from z in their last bits (~1e-7); a wrong report is off by far more.
NOISE_TOLERANCE = 1e-4


@dataclasses.dataclass
class PrivateAggregation:
  """A DP mechanism, its sampler and its accountant (build one with `build`).

  aggregator: the `tff.aggregators` factory to pass as `model_aggregator`.
  sampler: draws each round's clients (`sample`).
  accountant: composes the recorded rounds (`tff_dp.accounting.LedgerAccountant`).
  claim: the (noise, sampler) row of the claim table: relation and proof.
  """
  kind: str
  aggregator: Any
  sampler: Any
  accountant: accountant_lib.LedgerAccountant
  claim: claims.Claim
  ledger: Optional[ledger_lib.PrivacyLedger] = None
  records: list = dataclasses.field(default_factory=list)
  # Correlated noise: what writes each round's noise into the process state (else None).
  feed: Optional[Any] = None
  # The noise multiplier the aggregator was built with (what `record` checks reports against).
  noise_multiplier: Optional[float] = None

  @classmethod
  def build(cls, kind: str, client_ids: Sequence[Hashable], *, clients_per_round: int,
            clip: float, noise_multiplier: float, delta: float, rounds: Optional[int] = None,
            sampling_kind: Optional[str] = None, sampling_seed: Optional[int] = None,
            sampling_probability: Optional[float] = None,
            bands: Optional[int] = None, ledger_path: Optional[str] = None,
            ledger_key: Optional[bytes] = None, ledger_seal_path: Optional[str] = None,
            **aggregator_options) -> 'PrivateAggregation':
    """The mechanism `kind` (a `tff_dp.mechanisms.MECHANISMS` name) over `client_ids`.

    rounds: the rounds the run will have (correlated noise plans its strategy for them).
    sampling_kind: a `tff_dp.sampling.KINDS` name (default: the proven one for `kind`).
    sampling_probability: the Poisson kinds' rate q, fixed before the data is seen: the claim
      is then add/remove; None derives q from the population (clients_per_round / N) and the
      claim is zero-out (`accounting.claims`). `clients_per_round` is the mean's denominator.
    bands: BandMF's bands (cyclic Poisson: also its groups).
    ledger_path / ledger_key / ledger_seal_path: append every record to a ledger there (with
      chained MACs under the key, and the seal that commits to their count kept at
      `ledger_seal_path`, `tff_dp.ledger`).
    aggregator_options: further arguments of `mechanisms.build_aggregator`.
    """
    if kind not in mechanisms.MECHANISMS:
      raise errors.UserInputError(f'`kind` must be one of '
                                  f'{choices.one_of(mechanisms.MECHANISMS)}, got {kind!r}')
    mechanism = mechanisms.get(kind)
    sampling_kind = sampling_kind or mechanism.default_sampler
    claim = mechanisms.claim(kind, sampling_kind, sampling_probability is not None)
    groups = bands if sampling.get(sampling_kind).grouped else None
    client_ids = list(client_ids)
    delta_lib.check_delta(delta, len(client_ids))
    sampler = sampling.build_sampler(sampling_kind, client_ids, clients_per_round,
                                     seed=sampling_seed, groups=groups,
                                     probability=sampling_probability)
    if mechanism.noise.planned_for_rounds and rounds is None:
      raise errors.UserInputError(f'`kind={kind}` plans its noise for the run: give `rounds`')
    own = dict(aggregator_options, **({'bands': bands} if bands is not None else {}))
    # The options that follow the sampler's schedule (the tree's epoch, a strategy's plan),
    # unless given.
    options = {**mechanism.noise.schedule(sampler.rounds_per_epoch, rounds, own,
                                          amplified=groups is not None), **own}
    aggregator = mechanisms.build_aggregator(
        kind, noise_multiplier=noise_multiplier, clients_per_round=float(clients_per_round),
        clip=clip, **options)
    ledger = (ledger_lib.PrivacyLedger(ledger_path, mac_key=ledger_key,
                                       seal_path=ledger_seal_path)
              if ledger_path is not None else None)
    feed = noise_feed.for_factory(aggregator)
    return cls(kind, aggregator, sampler,
               accountant_lib.LedgerAccountant(delta, neighboring_relation=claim.columns_relation),
               claim, ledger, feed=feed, noise_multiplier=float(noise_multiplier))

  def sample(self, round_num: int) -> list:
    """The clients of round `round_num` (1-based), drawn once."""
    return self.sampler.sample(round_num)

  def state_for(self, round_num: int, state):
    """The state `process.next` takes for round `round_num`: `state` itself, or for correlated
    noise `state` with the round's noise written into it (a round not recorded is fed the
    same noise again)."""
    return state if self.feed is None else self.feed.into(state, round_num)

  def record(self, round_num: int, metrics) -> ledger_lib.RoundRecord:
    """Records round `round_num` from the process's output metrics (or the aggregator's own
    measurements): the queries the aggregator executed, its tree leaf, the strategy."""
    expected = len(self.records) + 1
    if round_num != expected:
      raise errors.UserInputError(
          f'round {round_num} recorded after {expected - 1} rounds: record every round once, '
          f'in order (the next is round {expected}); a skipped or repeated round would be '
          'stated as another run than the one that ran')
    found = metrics.get('aggregator', metrics) if hasattr(metrics, 'get') else metrics
    queries = aggregators.find_privacy_queries(found)
    if not queries:
      raise errors.UserInputError('the metrics hold no privacy_queries: pass the output '
                                  'metrics of a process built with `aggregator`')
    self._check_noise(round_num, queries)
    record = ledger_lib.RoundRecord(round_num, self.sampler.sampling_event(round_num),
                                    tuple(queries), aggregators.find_tree_leaf(found),
                                    getattr(self.aggregator, 'strategy', None),
                                    mechanisms.get(self.kind).noise.recorded_name)
    if self.feed is not None:
      self.feed.commit(round_num)
    if self.ledger is not None:
      self.ledger.append(record)
    self.accountant.add(record)
    self.records.append(record)
    return record

  def _check_noise(self, round_num: int, queries) -> None:
    """Refuses a round of independent noise whose reported queries do not add up to the
    factory's noise multiplier (z_eff of the round, McMahan & Andrew Eq. (1)): metrics of
    another process, or edited ones, would be stated as this mechanism."""
    if (not mechanisms.get(self.kind).noise.noise_in_round_queries
        or self.noise_multiplier is None):
      return
    multipliers = events.gaussian_noise_multipliers(
        ledger_lib.RoundRecord(round_num, self.sampler.sampling_event(round_num),
                               tuple(queries)), 'add_remove')
    z = (noise_budget.effective_noise_multiplier(multipliers) if multipliers
         else (0.0 if multipliers is None else math.inf))
    if not math.isclose(z, self.noise_multiplier, rel_tol=NOISE_TOLERANCE):
      raise errors.UserInputError(
          f'round {round_num}: the aggregator reported noise of multiplier {z:.6g} '
          f'(stddev / clip over its queries), not the {self.noise_multiplier:g} it was built '
          'with: pass the output metrics of the process built with `aggregator`')

  def guarantee(self) -> guarantee_lib.Headline:
    """The guarantee of the recorded rounds (`accounting.guarantee.of_records`, the one every
    surface of a run reads too): the proven fixed-size bound, the epsilon against a seed
    holder, or the accountant's, under the claim's relation."""
    return guarantee_lib.of_records(self.records, self.accountant.delta, self.accountant.methods,
                                epsilons=self.accountant.epsilon(final=True), found=self.claim)

  def epsilon(self) -> dict:
    """{method: epsilon} of the guarantee (`guarantee`) after the recorded rounds, at the
    accountant's delta: what `statement` leads with."""
    return dict(self.guarantee().epsilon)

  def statement(self) -> dict:
    """The guarantee of the recorded rounds: epsilon, delta, relation and the theorem (the
    headline `accounting.guarantee.of_records` gives, as a run's statement)."""
    head = self.guarantee()
    result = {'mechanism': self.kind, 'sampling': self.claim.sampler,
              'rounds': len(self.records), 'delta': self.accountant.delta,
              'neighboring_relation': head.relation,
              'relation': claims.RELATION_NAMES[head.relation],
              'proof': self.claim.proof, 'epsilon': dict(head.epsilon),
              'epsilon_is': head.label, 'sampling_rate': self.claim.rate,
              'population_size': 'treated as public'}
    if head.poisson_approximation is not None:
      result['epsilon_poisson_approximation'] = dict(head.poisson_approximation)
    if head.if_seed_secret is not None:
      result['epsilon_if_seed_secret'] = dict(head.if_seed_secret)
      result['note'] = 'against anyone who holds the sampling seed (no amplification)'
    return result
