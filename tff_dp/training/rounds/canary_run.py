"""Canary clients in a run: their ids in the population, their values in a round, their
statistics over rounds and the estimates the loop reports (issue 16; `tff_dp.canaries`).

The K inserted canaries are clients of the population like any other: the sampler draws them
(so N, q and the ledger count them) and the round's aggregator clips and noises their updates.
A canary's id is a `CanaryId`; `CanaryRun` is the run's round hook (`round_hooks`): it keeps
canary ids out of the data the loop reads, gives the whole round's client values, observes each
round's model change and reports the estimates on evaluation rounds and in the privacy
statement. The directions' key lives in a file under secret/ (`KEY_FILE`, owner-readable, like
the shuffled sampler's key); the tracker's statistics go into the checkpoint.
"""

import dataclasses
import time
from typing import Any, Callable, Hashable, Optional, Sequence

import numpy as np

from tff_dp import canaries
from tff_dp import checkpoint_aggregation as ca
from tff_dp import errors
from tff_dp import sampling
from tff_dp.canaries import audit as audit_lib
from tff_dp.canaries import insertion
from tff_dp.canaries import scores as scores_lib
from tff_dp.run_format import canary_audit
from tff_dp.run_format import columns
from tff_dp.training.report import privacy_statement
from tff_dp.training.run_state import round_hooks

KEY_FILE = 'canary_key'


@dataclasses.dataclass(frozen=True, order=True)
class CanaryId:
  """The client id of inserted canary `index` (never equal to a task's client id)."""
  index: int

  def __str__(self) -> str:
    return f'canary-{self.index}'


def population(client_ids: Sequence[Hashable], num_canaries: int) -> list:
  """The sampled population: the real clients, then the inserted canaries."""
  return list(client_ids) + [CanaryId(k) for k in range(num_canaries)]


def key(cfg, key_path: str, resume: bool) -> Optional[bytes]:
  """The canaries' secret key of a run with `cfg` (a `CanaryConfig`): a resumed run's, from
  `key_path`, or a new one; None without canaries or with `canary_seed`."""
  if not cfg.num_canaries or cfg.canary_seed is not None:
    return None
  found = sampling.load_key(key_path, what='canary key')
  if found is None and resume:
    raise errors.UserInputError(f'`resume`: {key_path} is missing; without the canary key the '
                                'canary statistics cannot be continued')
  return found if found is not None else canaries.new_key()


def counts(cfg, canary_key: Optional[bytes]) -> tuple[int, int]:
  """(inserted, held-out) canaries: as configured, or, with `canary_inclusion=coin`, each of
  the configured canaries inserted by its own fair coin from the key (or seed)."""
  if not cfg.num_canaries:
    return 0, 0
  if cfg.canary_inclusion == 'coin':
    candidates = cfg.num_canaries + cfg.unseen
    inserted = canaries.coin_inserted(candidates, seed=cfg.canary_seed, key=canary_key)
    return inserted, candidates - inserted
  return cfg.num_canaries, cfg.unseen


# The checkpoint entry of the canary statistics.
ENTRY = 'canaries'


def _trainable(process, state) -> list[np.ndarray]:
  """The trainable weights of the model in `state`, as numpy arrays."""
  return [np.asarray(w) for w in ca.model_weights(process, state).trainable]


class CanaryRun(round_hooks.RoundHook):
  """The canaries of one run: `directions` (with the run's key or seed), the dataset an
  inserted canary trains on (`empty_dataset_fn()`: an empty dataset of the clients' element
  type) and the run's delta (of the estimates)."""

  def __init__(self, directions: canaries.CanaryDirections,
               empty_dataset_fn: Callable[[], Any], delta: float = 1e-5, *,
               coin: bool = False, scores_path: Optional[str] = None):
    self.directions = directions
    self.delta = delta
    self.coin = coin   # Inserted by coin: the one-run bound holds.
    self.scores_path = scores_path   # canary_scores.csv (None: scores are not kept).
    self._last_audit: dict[str, float] = {}
    self._process = None
    self._empty_dataset_fn = empty_dataset_fn
    self._empty = None
    self._markers = insertion.markers(directions)
    self.tracker: Optional[canaries.CanaryTracker] = None
    self._previous: Optional[list[np.ndarray]] = None

  def split_sample(self, client_ids: Sequence[Hashable]) -> tuple[list, list]:
    """(real client ids, canary ids) of a sample, each in the sample's order."""
    return ([i for i in client_ids if not isinstance(i, CanaryId)],
            [i for i in client_ids if isinstance(i, CanaryId)])

  def start(self, process, state) -> None:
    """A new run from `state` (a resume then restores the tracker's state)."""
    self._process = process
    initial = _trainable(process, state)
    self.tracker = canaries.CanaryTracker(self.directions, initial)
    self._previous = initial

  def restore(self, loaded, process, state) -> None:
    if loaded is not None:
      self.tracker.set_state(loaded[ENTRY])
    if self.scores_path is not None:   # Rounds after the checkpoint run again.
      scores_lib.keep_through(self.scores_path, self.tracker.rounds_observed)
    self.continue_from(_trainable(process, state))

  def checkpoint_entries(self) -> dict[str, Any]:
    return {ENTRY: self.tracker.get_state()}

  def continue_from(self, trainable: Sequence[Any]) -> None:
    """The next round starts from these trainable weights (after a resume or a restart from
    a checkpoint aggregate)."""
    self._previous = [np.asarray(w) for w in trainable]

  def round_values(self, real_values: Sequence[Any], canary_ids: Sequence[CanaryId]) -> list:
    """The round's client values: each real client's dataset with the real marker, then each
    sampled canary's empty dataset with its marker."""
    if self._empty is None and canary_ids:
      self._empty = self._empty_dataset_fn()
    return ([insertion.client_value(v, insertion.REAL) for v in real_values]
            + [insertion.client_value(self._empty, self._markers[cid.index])
               for cid in canary_ids])

  def after_round(self, round_: round_hooks.Round) -> None:
    """Adds the round's model change to the statistics; on evaluation rounds, the two
    estimates at the run's delta."""
    t0 = time.perf_counter()
    end = _trainable(self._process, round_.trained_state)
    self.observe_round(end)
    if round_.state is not round_.trained_state:   # Restarted from a checkpoint aggregate.
      self.continue_from(_trainable(self._process, round_.state))
    if round_.is_eval:
      round_.row.update(self.estimates(end, self.delta))
      round_.row.update(self.audit(round_.num, end))
    round_.row['canary_seconds'] = time.perf_counter() - t0   # The bookkeeping's cost.

  def finish(self, report: round_hooks.FinalReport) -> None:
    """The statement's empirical estimate of the final model (and of all iterates)."""
    if report.final_state is None or not report.facts.dp:
      return
    tracker, delta = self.tracker, report.delta
    trainable = _trainable(self._process, report.final_state)
    estimates = {'final_model': (tracker.final_model_estimate(trainable, delta),
                                 tracker.final_model_interval(trainable, delta)),
                 'all_iterates': (tracker.all_iterates_estimate(delta),
                                  tracker.all_iterates_interval(delta))}
    report.statement['empirical_bounds'] = self.bounds_statement()
    report.statement['empirical_estimate'] = privacy_statement.empirical_estimate(
        tracker.directions.num_inserted, tracker.directions.num_unseen,
        {name: e for name, e in estimates.items() if e[0] is not None},
        min_canaries=canaries.MIN_CANARIES_FOR_AN_ESTIMATE)

  def observe_round(self, end_trainable: Sequence[Any]) -> None:
    """Adds the round that ended at these trainable weights (the next starts from them)."""
    end = [np.asarray(w) for w in end_trainable]
    self.tracker.observe_round(self._previous, end)
    self._previous = end

  def audit(self, round_num: int, trainable: Sequence[Any]) -> dict[str, float]:
    """{metrics column: value} of the canary audit of the model with these weights (bounds
    only where the canaries can give one), after keeping every canary's scores."""
    found = self.tracker.scores(trainable)
    if self.scores_path is not None:
      scores_lib.append(self.scores_path, round_num, found)
    self._last_audit = canary_audit.columns_of(found, self.delta, coin=self.coin,
                                               round_num=round_num)
    return self._last_audit

  def _no_one_run_bound(self) -> Optional[str]:
    """Why the run reports no one-run bound (None: it does)."""
    if not self.coin:
      return ('no one-run lower bound: the canaries were inserted by count, not each by its '
              'own coin (`canary_inclusion=coin`)')
    candidates = self.directions.num_inserted + self.directions.num_unseen
    needed = audit_lib.min_canaries_for_a_bound_over_guesses(self.delta)
    if candidates < needed:
      return (f'no one-run lower bound: {candidates} canaries, and at delta {self.delta:g} no '
              f'bound can exceed 0 at 95% confidence with fewer than {needed}')
    return None

  def audit_note(self) -> str:
    """The run's start line about its canaries and what their audit can say."""
    d = self.directions
    one_run = self._no_one_run_bound() or ('a one-run 95% lower bound on epsilon on every '
                                           'evaluation round')
    return (f'canaries: {d.num_inserted} inserted, {d.num_unseen} held out; {one_run}; '
            f'{scores_lib.FILE} keeps their scores')

  def bounds_statement(self) -> dict[str, Any]:
    """The statement's `empirical_bounds`: the last evaluation round's lower bounds."""
    found = {}
    for measure in ('bound_one_run', 'bound_clopper_pearson'):
      values = {t: self._last_audit[columns.canary_audit_column(measure, t)]
                for t in columns.CANARY_THREAT_MODELS
                if columns.canary_audit_column(measure, t) in self._last_audit}
      if values:
        found[measure[len('bound_'):]] = values
    entry = {'confidence': audit_lib.CONFIDENCE, 'lower_bounds': found,
             'note': 'lower bounds on epsilon: a bound above the proven epsilon is evidence of '
                     'a bug; one below it says nothing more (`python -m tff_dp.canaries '
                     '--run_dir` recomputes them from ' + scores_lib.FILE + ')'}
    reason = self._no_one_run_bound()
    if reason:
      entry['no_one_run_bound'] = reason
    return entry

  def estimates(self, trainable: Sequence[Any], delta: float) -> dict[str, float]:
    """{metrics column: estimated epsilon at `delta`} of the model with these weights, for
    each estimate the canaries allow (the all-iterates one needs unseen canaries)."""
    row = {}
    final = self.tracker.final_model_estimate(trainable, delta)
    if final is not None:
      row[columns.CANARY_FINAL_MODEL] = final.epsilon
    every = self.tracker.all_iterates_estimate(delta)
    if every is not None:
      row[columns.CANARY_ALL_ITERATES] = every.epsilon
    return row
