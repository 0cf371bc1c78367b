"""What DP-FTRL's samplers share, whose rounds are blocks of a secret keyed permutation
(`tff_dp.sampling.shuffled`, `tff_dp.sampling.min_separation`): the permutations and the
length of an epoch.
"""

from typing import Hashable, Optional, Sequence

import numpy as np

from tff_dp import ledger
from tff_dp.sampling.base import derived_key
from tff_dp.sampling.base import id_bytes
from tff_dp.sampling.base import keyed_words


def rounds_per_epoch(population_size: int, sample_size: int) -> int:
  """Rounds in an epoch of shuffled participation: N // m (the N mod m last clients of each
  epoch's permutation sit it out)."""
  return population_size // sample_size

class KeyedPermutations:
  """One pseudorandom order of the clients per epoch, a function of a secret 32-byte key.

  Epoch e's permutation sorts the clients by keyed BLAKE2b values of (e, client id): nobody
  without the key can predict an epoch's order from others' (numpy's generators would be
  predictable from their outputs), the same key gives the same orders after a resume, and a
  client's value does not depend on the other clients. `key` None draws 32 bytes from the OS
  (persist `key` to resume); an integer `seed` derives the key from it (reproducible, not
  secret from whoever holds the seed)."""

  def __init__(self, client_ids: Sequence[Hashable], seed: Optional[int],
               key: Optional[bytes]):
    self.key = derived_key(seed, key)
    self._ids = id_bytes(client_ids)
    self._epoch: Optional[int] = None
    self._permutation: Optional[np.ndarray] = None

  def __call__(self, epoch: int) -> np.ndarray:
    """Epoch `epoch`'s order (indices into the population); the last epoch's is kept."""
    if epoch != self._epoch:
      values = keyed_words(self.key, b'epoch %d' % epoch, self._ids)
      self._epoch, self._permutation = epoch, np.argsort(values, kind='stable')
    return self._permutation


def production_epoch_event(event, population: int, cohort: int, round_num: int):
  """The event of round `round_num` of a production run taking blocks of `cohort` from a
  permutation of `population`, the kind of the run's `event` (its epoch: the production
  run's, every population // cohort rounds)."""
  return ledger.SamplingEvent(event.kind, population, sample_size=cohort,
                              epoch=(round_num - 1) // rounds_per_epoch(population, cohort) + 1)
