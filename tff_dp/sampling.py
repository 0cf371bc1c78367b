"""Client samplers and their privacy-ledger events; the sample is secret unless seeded.

The amplification the accountant applies (q = m / N) assumes nobody but the mechanism knows
which clients a round used. By default (`seed=None`) every round's draw therefore comes from
the operating system's CSPRNG (`os.urandom`): nothing in the run's outputs, config or
checkpoints lets anyone recompute a sample, and a resumed run simply draws fresh samples for
the rounds it (re-)executes (each execution is its own ledger record). With an explicit
integer `seed`, round r's draw is `np.random.default_rng([seed, r])`: reproducible simulations
and resume, but whoever holds the seed knows every round's membership (the run's privacy
statement says so).

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
"""

import operator
import os
from typing import Hashable, List, Optional, Sequence

import numpy as np

from tff_dp import choices
from tff_dp import errors
from tff_dp import ledger


def _check_population(client_ids: Sequence[Hashable]) -> List[Hashable]:
  ids = list(client_ids)
  if not ids:
    raise errors.UserInputError('client_ids is empty: there is no client to sample.')
  if len(set(ids)) != len(ids):
    raise errors.UserInputError('client_ids contains duplicates; each client must appear once.')
  return ids


def _non_negative_int(value, name: str) -> int:
  try:
    value = operator.index(value)
  except TypeError:
    raise errors.UserInputError(f'{name} must be an integer, got {value!r}.') from None
  if value < 0:
    raise errors.UserInputError(f'{name} must be non-negative, got {value}.')
  return int(value)


def _check_seed(seed) -> Optional[int]:
  return None if seed is None else _non_negative_int(seed, 'seed')


class _SecretRandomness:
  """Uniform draws from the OS CSPRNG (a CSPRNG because the draws are what must stay secret:
  numpy's generators are predictable from their outputs, `os.urandom` is not)."""

  def uniform(self, n: int) -> np.ndarray:
    """n floats in [0, 1) with 53 random bits each."""
    words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53

  def choice(self, n: int, m: int) -> np.ndarray:
    """m distinct indices of range(n), uniformly: the m smallest of n i.i.d. random keys."""
    keys = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    return np.argpartition(keys, m - 1)[:m] if m < n else np.arange(n)


class _SeededRandomness:
  """Reproducible draws: round r uses `np.random.default_rng([seed, r])` (no state to keep)."""

  def __init__(self, seed: int, round_num: int):
    self._rng = np.random.default_rng([seed, round_num])

  def uniform(self, n: int) -> np.ndarray:
    return self._rng.random(n)

  def choice(self, n: int, m: int) -> np.ndarray:
    return self._rng.choice(n, m, replace=False)


class _Sampler:
  """Draws each round once from secret (seed None) or seeded randomness."""

  def __init__(self, client_ids: Sequence[Hashable], seed: Optional[int]):
    self.client_ids = _check_population(client_ids)
    self.seed = _check_seed(seed)
    self._drawn: dict[int, list] = {}

  @property
  def secret(self) -> bool:
    """Whether the samples are known to nobody (no seed exists that reproduces them)."""
    return self.seed is None

  def sample(self, round_num: int) -> list:
    """Clients sampled for `round_num`, in population order (the same list if asked again)."""
    round_num = _non_negative_int(round_num, 'round_num')
    if round_num not in self._drawn:
      randomness = (_SecretRandomness() if self.seed is None
                    else _SeededRandomness(self.seed, round_num))
      idx = np.sort(self._draw(randomness))
      self._drawn[round_num] = [self.client_ids[i] for i in idx]
      for old in [r for r in self._drawn if r < round_num - 1]:
        del self._drawn[old]   # Only the current and the prefetched round are kept.
    return list(self._drawn[round_num])

  def _draw(self, randomness) -> np.ndarray:
    raise NotImplementedError


class PoissonSampler(_Sampler):
  """Includes each client independently with probability q (may return no client)."""

  def __init__(self, client_ids: Sequence[Hashable], probability: float,
               seed: Optional[int] = None):
    super().__init__(client_ids, seed)
    try:
      q = float(probability)
    except (TypeError, ValueError):
      raise errors.UserInputError(
          f'sampling probability must be a number, got {probability!r}.') from None
    if not 0.0 < q <= 1.0:  # Also rejects NaN.
      raise errors.UserInputError(f'sampling probability must be in (0, 1], got {q}.')
    self.probability = q

  @property
  def expected_clients_per_round(self) -> float:
    return self.probability * len(self.client_ids)

  def _draw(self, randomness) -> np.ndarray:
    return np.flatnonzero(randomness.uniform(len(self.client_ids)) < self.probability)

  def sampling_event(self) -> ledger.SamplingEvent:
    return ledger.SamplingEvent(kind='poisson', population_size=len(self.client_ids),
                                probability=self.probability)


class FixedSizeSampler(_Sampler):
  """Samples exactly `sample_size` distinct clients uniformly (without replacement)."""

  def __init__(self, client_ids: Sequence[Hashable], sample_size: int,
               seed: Optional[int] = None):
    super().__init__(client_ids, seed)
    try:
      m = operator.index(sample_size)
    except TypeError:
      raise errors.UserInputError(f'sample_size must be an integer, got {sample_size!r}.') \
          from None
    if not 1 <= m <= len(self.client_ids):
      raise errors.UserInputError(
          f'sample_size must be in [1, {len(self.client_ids)}] (the population), got {m}.')
    self.sample_size = int(m)

  @property
  def expected_clients_per_round(self) -> float:
    return float(self.sample_size)

  def _draw(self, randomness) -> np.ndarray:
    return randomness.choice(len(self.client_ids), self.sample_size)

  def sampling_event(self) -> ledger.SamplingEvent:
    return ledger.SamplingEvent(kind='fixed_size', population_size=len(self.client_ids),
                                sample_size=self.sample_size)


# `client_sampling` -> the sampler of `clients_per_round` clients (its expected number for
# Poisson) from a population (`build_sampler`).
_SAMPLERS = {
    'poisson': lambda ids, m, seed: PoissonSampler(ids, m / len(ids), seed=seed),
    'fixed_size': lambda ids, m, seed: FixedSizeSampler(ids, m, seed=seed),
}
choices.check_implemented(choices.CLIENT_SAMPLERS, _SAMPLERS, 'tff_dp.sampling')


def build_sampler(kind: str, client_ids: Sequence[Hashable], clients_per_round: int,
                  seed: Optional[int] = None) -> _Sampler:
  """The `kind` sampler (a `choices.CLIENT_SAMPLERS` name) of `clients_per_round` clients."""
  if kind not in _SAMPLERS:
    raise errors.UserInputError(f'`client_sampling` must be one of '
                                f'{choices.one_of(_SAMPLERS)}, got {kind!r}')
  ids = _check_population(client_ids)
  return _SAMPLERS[kind](ids, clients_per_round, seed)
