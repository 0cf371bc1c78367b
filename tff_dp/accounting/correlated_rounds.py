"""The accountant of correlated-noise DP-FTRL ledgers (`dp=blt|bandmf`, records with a
`correlated` strategy): min-separation participation under zero-out, cyclic Poisson under
add/remove (the claim table, `claims`).

Min separation: the run is one Gaussian mechanism (`correlated`): after round t, the mechanism
on the first t rounds has noise multiplier z_t = sigma / (clip x sens_t), sigma the stddev of
the fresh draws and sens_t the min-separation sensitivity of the strategy's first t rounds.
RDP is that Gaussian's, alpha / (2 z_t^2); PLD is dp_accounting's exact Gaussian PLD.

Cyclic Poisson (amplified BandMF): after round t, in cycle c, the c-fold composition of the
Poisson-sampled (q) Gaussian with multiplier sigma / (clip x the largest column norm of the
first t rounds); RDP by the vectorised series (`rdp_gaussian`), PLD by dp_accounting.

Refused: another strategy or
schedule mid-run, a participation schedule the strategy was not planned for, and a round
recorded twice (a resume re-executed a released round with the same noise state, which no
analysis here covers).
"""

import copy
import math
from typing import Optional, Sequence

import dp_accounting
import numpy as np

from tff_dp import errors
from tff_dp import ledger
from tff_dp import sampling
from tff_dp.accounting import claims
from tff_dp.accounting import correlated
from tff_dp.accounting import events
from tff_dp.accounting import mechanism_account
from tff_dp.accounting import noise_family
from tff_dp.matrix_factorization import toeplitz


class CorrelatedRounds(mechanism_account.MechanismAccount):
  """RDP / PLD of a correlated-noise ledger so far."""
  name = 'correlated-noise DP-FTRL'

  def __init__(self, orders: Sequence[float], neighboring_relation: str,
               methods: Sequence[str], pld_discretization: float):
    super().__init__(orders, neighboring_relation, methods, pld_discretization)
    self._strategy: Optional[ledger.CorrelatedNoise] = None
    self._coefs: Optional[np.ndarray] = None
    self._ratio = math.inf        # Smallest sigma / clip over the rounds.
    self._last_round = 0
    self._probability: Optional[float] = None   # Cyclic Poisson's q (amplified), else None.
    self._cycles = 0

  def compose(self, record: ledger.RoundRecord) -> None:
    claims.check_relation(claims.claim_of_record(record), self.neighboring_relation)
    noise, r = record.correlated, record.round_num
    if self._strategy is None:
      self._strategy, self._coefs = noise, correlated.coefs_of(noise)
    elif noise != self._strategy:
      raise errors.UserInputError(f'Round {r} records another correlated-noise strategy or '
                                  'schedule than round 1; one run is one strategy.')
    if r != self._last_round + 1:
      raise errors.UserInputError(
          f'Round {r} follows round {self._last_round} in a correlated-noise ledger: a resume '
          're-executed a round whose output was already released, which this accounting does '
          'not cover (checkpoint these runs every round: `rounds_per_checkpoint=1`).')
    if sampling.get(record.sampling.kind).grouped:
      self._check_cycle(record)
    else:
      self._check_schedule(record)
    multipliers = events.gaussian_noise_multipliers(record, self.neighboring_relation)
    if multipliers is None:
      self._ratio = 0.0
    elif multipliers:
      self._ratio = min(self._ratio, min(multipliers))
    self._last_round = r

  def _check_schedule(self, record: ledger.RoundRecord) -> None:
    """The sampler's cycle (every population // sample_size rounds) must give at least the
    strategy's separation and at most its participations over its rounds."""
    s, noise = record.sampling, self._strategy
    cycle = s.population_size // s.sample_size
    if cycle < noise.min_separation or math.ceil(noise.rounds / cycle) > (
        noise.max_participations) or record.round_num > noise.rounds:
      raise errors.UserInputError(
          f'Round {record.round_num}: clients participate every {cycle} rounds, over '
          f'{noise.rounds} rounds; the strategy was planned for at least '
          f'{noise.min_separation} rounds apart and at most {noise.max_participations} '
          'participations, and that many rounds.')

  def _check_cycle(self, record: ledger.RoundRecord) -> None:
    """Cyclic Poisson must amplify this strategy (bandmf, bands <= groups), over the groups it
    was planned for (its min separation), with one q for the run."""
    s, noise = record.sampling, self._strategy
    correlated.check_amplified_record(noise, s.groups)
    if s.groups != noise.min_separation or record.round_num > noise.rounds:
      raise errors.UserInputError(
          f'Round {record.round_num}: cyclic Poisson over {s.groups} groups; the strategy was '
          f'planned for {noise.min_separation} groups and {noise.rounds} rounds.')
    if self._probability not in (None, s.probability):
      raise errors.UserInputError(f'Round {record.round_num} samples with q = {s.probability}, '
                                  f'earlier rounds with {self._probability}; one run, one q.')
    self._probability, self._cycles = s.probability, max(self._cycles, s.epoch)

  def _multiplier(self, amplified: bool = True) -> float:
    """z_t = sigma / (clip sens_t) after the rounds so far (amplified: sens_t is one
    participation's; not `amplified`: cyclic Poisson's every cycle, as a seed holder sees)."""
    if self._last_round == 0:
      return math.inf
    if self._probability is None:
      participations = self._strategy.max_participations
    else:
      participations = 1 if amplified else self._cycles
    sens = math.sqrt(toeplitz.sensitivity_squared(
        self._coefs, self._last_round, self._strategy.min_separation, participations))
    return self._ratio / sens

  def multiplier_without_amplification(self) -> float:
    """The Gaussian's multiplier against someone who knows every sample (a seed holder): a
    client in every cycle of cyclic Poisson sampling, its rounds `groups` apart."""
    return self._multiplier(amplified=False)

  def rdp(self) -> np.ndarray:
    z = self._multiplier()
    if z == 0.0:
      return np.full(len(self.orders), np.inf)
    if z == math.inf:
      return np.zeros(len(self.orders))
    if self._probability is not None:
      return correlated.amplified_rdp(self._probability, z, self._cycles, self.orders)
    return np.asarray(self.orders) / (2.0 * z * z)

  def epsilon_pld(self, delta: float) -> Optional[float]:
    z = self._multiplier()
    if z == 0.0:
      return math.inf
    if z == math.inf:
      return 0.0
    acc = dp_accounting.pld.PLDAccountant(
        neighboring_relation=events.dp_accounting_relation(
            self.neighboring_relation, sampled=self._probability is not None),
        value_discretization_interval=self.pld_discretization)
    event = (dp_accounting.GaussianDpEvent(z) if self._probability is None else
             correlated.amplified_event(self._probability, z, self._cycles))
    return float(acc.compose(event).get_epsilon(delta))

  def rdp_copy(self) -> 'CorrelatedRounds':
    return copy.deepcopy(self)


def _planned(cycle, total_rounds, own, amplified) -> dict:
  # A strategy is planned for the run's rounds and the sampler's participation schedule.
  return dict(correlated.planned_schedule(own, cycle, total_rounds), amplified=amplified)


# Correlated noise of a Toeplitz strategy (BLT, BandMF DP-FTRL), composed by
# `CorrelatedRounds`.
FAMILY = noise_family.register(noise_family.NoiseFamily(
    name='correlated', title='correlated noise',
    unproven_because='no analysis of its participation',
    statement=('DP-FTRL ({dp}: correlated noise, fixed clip), the strategy and schedule as '
               'recorded in ledger.jsonl (`correlated`: buf_decay / output_scale, bands or '
               'coefs, min_separation, max_participations)'),
    account=CorrelatedRounds, carries_state=True, planned_for_rounds=True,
    schedule_arguments=_planned, named_in_records=False))
