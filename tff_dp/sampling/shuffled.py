"""`ShuffledSampler`, the tree's (DP-FTRL) sampling: each epoch a fresh secret permutation of
the population, taken in consecutive blocks, so every client participates at most once per
epoch."""

from typing import Hashable, Optional, Sequence

import numpy as np

from tff_dp import ledger
from tff_dp.sampling.base import check_population
from tff_dp.sampling.base import check_sample_size
from tff_dp.sampling.base import check_seed
from tff_dp.sampling.base import epoch_of
from tff_dp.sampling.kind import SamplerKind
from tff_dp.sampling.kind import SamplerRequest
from tff_dp.sampling.permutation import KeyedPermutations
from tff_dp.sampling.permutation import production_epoch_event
from tff_dp.sampling.permutation import rounds_per_epoch


class ShuffledSampler:
  """Epoch e is a permutation of the population; its rounds take consecutive blocks of it.

  With N clients and `sample_size` m an epoch has `rounds_per_epoch` = N // m rounds; round r
  (1-based) is in epoch (r - 1) // (N // m) + 1 and takes block (r - 1) % (N // m) of that
  epoch's permutation (the N mod m clients at its end sit the epoch out). So every client
  participates at most once per epoch, which the tree-aggregation accountant requires.

  The permutations are a secret `key`'s (`KeyedPermutations`): `key` None draws a new one
  (`secret` is then True; persist `key` to resume), an integer `seed` derives it.
  """

  kind = 'shuffled'   # Its ledger events' kind (`KIND.name`).

  def __init__(self, client_ids: Sequence[Hashable], sample_size: int,
               seed: Optional[int] = None, key: Optional[bytes] = None):
    self.client_ids = check_population(client_ids)
    self.sample_size = check_sample_size(sample_size, len(self.client_ids))
    self.seed = check_seed(seed)
    self._permutations = KeyedPermutations(self.client_ids, self.seed, key)
    self.key = self._permutations.key
    self.rounds_per_epoch = rounds_per_epoch(len(self.client_ids), self.sample_size)

  @property
  def secret(self) -> bool:
    return self.seed is None

  @property
  def expected_clients_per_round(self) -> float:
    return float(self.sample_size)

  def epoch(self, round_num: int) -> int:
    """The 1-based epoch of 1-based round `round_num`."""
    return epoch_of(round_num, self.rounds_per_epoch)

  def permutation(self, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s order of the population (indices into `client_ids`)."""
    return self._permutations(epoch)

  def order(self, round_num: int) -> np.ndarray:
    """The permutation whose blocks round `round_num` is taken from: its epoch's."""
    return self.permutation(self.epoch(round_num))

  def sample(self, round_num: int) -> list:
    """The clients of `round_num`, in population order."""
    order = self.order(round_num)
    block = (round_num - 1) % self.rounds_per_epoch
    m = self.sample_size
    idx = np.sort(order[block * m:(block + 1) * m])
    return [self.client_ids[i] for i in idx]

  def sampling_event(self, round_num: int) -> ledger.SamplingEvent:
    return ledger.SamplingEvent(kind=self.kind, population_size=len(self.client_ids),
                                sample_size=self.sample_size, epoch=self.epoch(round_num),
                                seeded=not self.secret)


def _build(request: SamplerRequest) -> ShuffledSampler:
  return ShuffledSampler(request.client_ids, request.clients_per_round, seed=request.seed,
                         key=request.key)


def _statement(event) -> dict:
  return {'sample_size': event.sample_size, 'accounted_as': (
      'each epoch a secret permutation of the population, taken in consecutive blocks: '
      'every client at most once per epoch and per noise tree, no amplification by sampling '
      '(tree aggregation, one SingleEpochTreeAggregationDpEvent per epoch)')}


KIND = SamplerKind(
    name=ShuffledSampler.kind, title='shuffled',
    description=('each epoch a fresh secret permutation of the population, cut into '
                 'consecutive blocks of clients_per_round (DP-FTRL: at most one participation '
                 'per epoch)'),
    build=_build, keyed=True, production_event=production_epoch_event, statement=_statement)
