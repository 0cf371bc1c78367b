"""`MinSeparationSampler`, correlated-noise DP-FTRL's sampling: one secret permutation of the
population, its blocks visited cyclically, so a client participates every N // m rounds."""

import dataclasses
import math

import numpy as np

from tff_dp import ledger
from tff_dp.sampling.kind import SamplerKind
from tff_dp.sampling.kind import SamplerRequest
from tff_dp.sampling.permutation import production_epoch_event
from tff_dp.sampling.shuffled import ShuffledSampler


class MinSeparationSampler(ShuffledSampler):
  """One secret permutation of the population, cut into P = N // m blocks visited cyclically:
  round r takes block (r - 1) % P, so a client participates every P rounds, at most
  ceil(rounds / P) times (the N mod m clients at the permutation's end never do). What
  correlated-noise DP-FTRL is accounted under (min separation P). Keys, seeds and secrecy as
  `ShuffledSampler`'s; `epoch(r)` is the cycle of round r."""

  kind = 'min_separation'

  @property
  def min_separation(self) -> int:
    return self.rounds_per_epoch

  def order(self, round_num: int) -> np.ndarray:
    """The one permutation, every cycle."""
    self.epoch(round_num)   # Checks round_num.
    return self.permutation(1)


def _build(request: SamplerRequest) -> MinSeparationSampler:
  return MinSeparationSampler(request.client_ids, request.clients_per_round,
                              seed=request.seed, key=request.key)


def _production_noise(noise: ledger.CorrelatedNoise, separation: int) -> ledger.CorrelatedNoise:
  """The schedule follows the population: a production run's clients come back every
  `separation` rounds, at most ceil(rounds / separation) times."""
  return dataclasses.replace(noise, min_separation=separation,
                             max_participations=math.ceil(noise.rounds / separation))


def _statement(event) -> dict:
  return {'sample_size': event.sample_size, 'accounted_as': (
      'one secret permutation of the population, its blocks visited cyclically: every '
      f'client every {event.population_size // event.sample_size} rounds, no amplification '
      'by sampling (correlated noise: the whole run is one Gaussian mechanism whose '
      'sensitivity is the strategy\'s under min-separation participation). The blocks have '
      'a fixed size, so adding a client would move others between rounds: the proof is '
      'under zero-out, not add/remove')}


KIND = SamplerKind(
    name=MinSeparationSampler.kind, title='min-separation',
    description=('one secret permutation of the population cut into N // clients_per_round '
                 'blocks visited cyclically: each client every N // clients_per_round rounds '
                 '(correlated-noise DP-FTRL)'),
    build=_build, keyed=True, production_event=production_epoch_event, statement=_statement,
    production_noise=_production_noise)
