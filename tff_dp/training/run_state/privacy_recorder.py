"""A run's privacy bookkeeping in the round loop: each round's ledger record (durable before any
output of the round), its epsilon columns, and the `max_epsilon` prediction of the next round.

The loop calls the same three methods whatever the mechanism; what differs between mechanisms
(the tree's leaf, the relation) is read from the aggregator's report and handled by the
accountant. `NO_DP` is the recorder of a run without DP: it records nothing.
"""

import dataclasses
from typing import Any, Optional, Sequence

from tff_dp import ledger as ledger_lib
from tff_dp.accounting import guarantee
from tff_dp.accounting import noise_cohort
from tff_dp.aggregators import privacy_queries as privacy_queries_lib
from tff_dp.training.run_state import resume
from tff_dp.training.run_state import run_dir as run_dir_lib

# How much less noise, relative, the prediction of the next round assumes: float32 computes each
# round's noise stddev as z * clip from the round's clip, so the next round's stddev / clip
# differs from the last round's by at most two float32 roundings (2 * 2^-24 ~ 1.2e-7); 1e-6
# covers that with margin, and less noise can only raise epsilon.
PREDICTION_MARGIN = 1e-6


def next_round_bound(queries) -> tuple:
  """`queries` with each noise stddev lowered by PREDICTION_MARGIN: a `max_epsilon` prediction
  of the next round that holds whatever last bits its float32 tuples get."""
  return tuple(ledger_lib.GaussianSumQuery(q.name, q.l2_norm_clip,
                                           q.noise_stddev * (1.0 - PREDICTION_MARGIN))
               for q in queries)


@dataclasses.dataclass
class Projection:
  """The production run a noise-cohort simulation stands for (`noise_cohort.NoiseCohort`):
  each recorded round is replayed as its production round into `accountant`, at `delta`."""
  cohort: noise_cohort.NoiseCohort
  accountant: Any                   # tff_dp.accounting.LedgerAccountant
  delta: float

  def add(self, record: ledger_lib.RoundRecord) -> None:
    self.accountant.add(self.cohort.production_record(record))

  def epsilons(self, is_last: bool) -> dict[str, Optional[float]]:
    """{method: projected epsilon}; the final PLD value always."""
    return self.accountant.epsilon(final=is_last)

  def statement(self) -> dict[str, Any]:
    """What the privacy statement says of the projection (`privacy_statement.statement`)."""
    return {'noise_cohort_size': self.cohort.cohort_size,
            'noise_population': self.cohort.population,
            'trained_clients_per_round': self.cohort.clients_per_round,
            'noise_scale': self.cohort.scale, 'delta': self.delta,
            'projected_epsilon': self.epsilons(is_last=True)}


@dataclasses.dataclass
class PrivacyRecorder:
  """The ledger, the accountant, and the sampler whose events they record.

  planned_queries: the queries round 1 will execute (what `max_epsilon` predicts from before
    any record exists); planned_tree_leaf: 1 for tree aggregation (DP-FTRL), else None.
  """
  ledger: ledger_lib.PrivacyLedger
  accountant: Any                   # tff_dp.accounting.LedgerAccountant
  sampler: Any
  planned_queries: Sequence[ledger_lib.GaussianSumQuery] = ()
  planned_tree_leaf: Optional[int] = None
  # The correlated-noise strategy every record carries (dp=blt|bandmf), else None.
  correlated: Optional[ledger_lib.CorrelatedNoise] = None
  # The noise family every record names (`NoiseFamily.recorded_name`), else None.
  noise: Optional[str] = None
  last_record: Optional[ledger_lib.RoundRecord] = None   # Of the last executed round.
  projection: Optional[Projection] = None   # A noise cohort's projected production run.
  # Every record the accountant composed, in ledger order (what the headline is of).
  records: list = dataclasses.field(default_factory=list)

  def resume(self, run_dir, checkpoint_round: int, log) -> None:
    """Reconciles the ledger with what was released (`resume.reconcile_ledger`) and replays
    the records that stay counted into the accountant."""
    self.ledger, records = resume.reconcile_ledger(self.ledger, run_dir, checkpoint_round, log)
    self.records = list(records)
    for record in records:
      self.accountant.add(record)
      if self.projection is not None:
        self.projection.add(record)
    self.last_record = records[-1] if records else None

  def record(self, round_num: int, aggregator_metrics) -> None:
    """Appends the round's ledger record (durable before any output of the round is
    released) and adds it to the accountant."""
    queries = privacy_queries_lib.find_privacy_queries(aggregator_metrics)
    if not queries:
      raise RuntimeError('DP is on but the aggregator reported no privacy_queries; refusing '
                         'to train without a ledger record')
    self.last_record = ledger_lib.RoundRecord(
        round_num, self.sampler.sampling_event(round_num), tuple(queries),
        privacy_queries_lib.find_tree_leaf(aggregator_metrics), self.correlated, self.noise)
    with run_dir_lib.writing(f'the ledger record of round {round_num}', self.ledger.path):
      self.ledger.append(self.last_record)
    self.accountant.add(self.last_record)
    self.records.append(self.last_record)
    if self.projection is not None:
      self.projection.add(self.last_record)

  def epsilon_columns(self, is_last: bool) -> dict[str, Optional[float]]:
    """{'epsilon_<method>': epsilon after the recorded rounds}; the final PLD value always.
    With a noise cohort also {'projected_epsilon_<method>': the production run's}."""
    columns = {f'epsilon_{method}': eps
               for method, eps in self.accountant.epsilon(final=is_last).items()}
    if self.projection is not None:
      columns.update({f'projected_epsilon_{method}': eps
                      for method, eps in self.projection.epsilons(is_last).items()})
    return columns

  def predicted_epsilon(self, round_num: int) -> Optional[float]:
    """The headline epsilon (`guarantee.predicted`: the proven fixed-size bound, the epsilon
    against a seed holder, ...) after `round_num` if its mechanism matches the last executed
    (or planned) one: the planned tuples of round 1 are exact; later, the last round's tuples
    with less noise (`next_round_bound`), since the next clip's float32 tuple can differ in
    its last bits."""
    last = self.last_record
    queries = (next_round_bound(last.queries) if last is not None
               else tuple(self.planned_queries))
    if not queries:
      return None
    sampling_event = self.sampler.sampling_event(round_num)
    leaf = None
    if last is not None and last.tree_leaf is not None:
      # The tree goes on within an epoch (at least as costly as a restart) and restarts at an
      # epoch boundary (the tree factories do).
      leaf = last.tree_leaf + 1 if sampling_event.epoch == last.sampling.epoch else 1
    elif last is None:
      leaf = self.planned_tree_leaf
    record = ledger_lib.RoundRecord(round_num, sampling_event, tuple(queries), leaf,
                                    self.correlated, self.noise)
    return guarantee.predicted(self.records, record, self.accountant)


class _NoDP:
  """The recorder of a run without DP: no ledger, no epsilon, nothing to predict."""
  ledger = None
  accountant = None
  projection = None

  def resume(self, run_dir, checkpoint_round: int, log) -> None:
    del run_dir, checkpoint_round, log

  def record(self, round_num: int, aggregator_metrics) -> None:
    del round_num, aggregator_metrics

  def epsilon_columns(self, is_last: bool) -> dict:
    del is_last
    return {}

  def predicted_epsilon(self, round_num: int) -> None:
    del round_num


NO_DP = _NoDP()
