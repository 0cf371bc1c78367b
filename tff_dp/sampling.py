"""Client samplers, deterministic in (seed, round_num), and their privacy-ledger events.

A resumed run re-samples identically because each round's draw uses a fresh
`np.random.default_rng([seed, round_num])` (no generator state to checkpoint).

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
from typing import Hashable, List, Sequence

import numpy as np

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


def _check_seed(seed) -> int:
  return _non_negative_int(seed, 'seed')


def _rng(seed: int, round_num) -> np.random.Generator:
  round_num = _non_negative_int(round_num, 'round_num')
  return np.random.default_rng([seed, round_num])


class PoissonSampler:
  """Includes each client independently with probability q (may return no client)."""

  def __init__(self, client_ids: Sequence[Hashable], probability: float, seed: int):
    self.client_ids = _check_population(client_ids)
    try:
      q = float(probability)
    except (TypeError, ValueError):
      raise errors.UserInputError(
          f'sampling probability must be a number, got {probability!r}.') from None
    if not 0.0 < q <= 1.0:  # Also rejects NaN.
      raise errors.UserInputError(f'sampling probability must be in (0, 1], got {q}.')
    self.probability = q
    self.seed = _check_seed(seed)

  @property
  def expected_clients_per_round(self) -> float:
    return self.probability * len(self.client_ids)

  def sample(self, round_num: int) -> list:
    """Clients sampled for `round_num`, in population order; deterministic in (seed, round)."""
    mask = _rng(self.seed, round_num).random(len(self.client_ids)) < self.probability
    return [self.client_ids[i] for i in np.flatnonzero(mask)]

  def sampling_event(self) -> ledger.SamplingEvent:
    return ledger.SamplingEvent(kind='poisson', population_size=len(self.client_ids),
                                probability=self.probability)


class FixedSizeSampler:
  """Samples exactly `sample_size` distinct clients uniformly (without replacement)."""

  def __init__(self, client_ids: Sequence[Hashable], sample_size: int, seed: int):
    self.client_ids = _check_population(client_ids)
    try:
      m = operator.index(sample_size)
    except TypeError:
      raise errors.UserInputError(f'sample_size must be an integer, got {sample_size!r}.') \
          from None
    if not 1 <= m <= len(self.client_ids):
      raise errors.UserInputError(
          f'sample_size must be in [1, {len(self.client_ids)}] (the population), got {m}.')
    self.sample_size = int(m)
    self.seed = _check_seed(seed)

  @property
  def expected_clients_per_round(self) -> float:
    return float(self.sample_size)

  def sample(self, round_num: int) -> list:
    """Clients sampled for `round_num`, in population order; deterministic in (seed, round)."""
    idx = _rng(self.seed, round_num).choice(len(self.client_ids), self.sample_size,
                                            replace=False)
    return [self.client_ids[i] for i in np.sort(idx)]

  def sampling_event(self) -> ledger.SamplingEvent:
    return ledger.SamplingEvent(kind='fixed_size', population_size=len(self.client_ids),
                                sample_size=self.sample_size)
