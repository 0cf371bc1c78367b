"""The secrets a run keeps beside its samplers: the held-out evaluation clients' key, the
population's digest, and how a key file is read and written (owner-only).
"""

import hashlib
import os
from typing import Hashable, List, Optional, Sequence

import numpy as np

from tff_dp import errors
from tff_dp.sampling.base import KEY_BYTES
from tff_dp.sampling.base import check_population
from tff_dp.sampling.base import check_seed
from tff_dp.sampling.base import id_bytes


def holdout_key(seed: Optional[int]) -> bytes:
  """The key choosing held-out evaluation clients: 32 bytes from the OS, or derived from a
  sampling seed (reproducible, and then known to whoever holds the seed)."""
  if seed is None:
    return os.urandom(KEY_BYTES)
  return hashlib.sha256(b'tff_dp.sampling.hold_out seed %d' % check_seed(seed)).digest()

def check_holdout_count(count: int, candidates: int) -> None:
  """Refuses holding out `count` of `candidates` clients unless at least one is held out and
  one is left."""
  if not 1 <= count < candidates:
    raise errors.UserInputError(f'`eval_holdout_clients={count}` must be in [1, {candidates}): '
                                f'held out from {candidates} clients (those with test data)')

def hold_out(client_ids: Sequence[Hashable], count: int, key: bytes
             ) -> tuple[List[Hashable], List[Hashable]]:
  """(held out, the rest, both in population order): the `count` clients with the smallest
  keyed BLAKE2b values of their ids. A function of the key and the ids only (not of their
  order), so a resume holds out the same clients; unpredictable without the key."""
  ids = check_population(client_ids)
  check_holdout_count(count, len(ids))
  values = [hashlib.blake2b(str(cid).encode('utf-8'), key=key, digest_size=16).digest()
            for cid in ids]
  chosen = set(np.argsort(np.array(values, dtype=object), kind='stable')[:count].tolist())
  return ([c for i, c in enumerate(ids) if i in chosen],
          [c for i, c in enumerate(ids) if i not in chosen])

def population_digest(client_ids: Sequence[Hashable]) -> bytes:
  """SHA-256 of the population's ids (their text, sorted, each length-prefixed): what a resume
  compares with the recorded population (`KEY_BYTES` long, kept like a key under secret/). A
  function of the set of ids, not their order."""
  digest = hashlib.sha256(b'tff_dp.sampling population')
  for i in sorted(id_bytes(check_population(client_ids))):
    digest.update(len(i).to_bytes(8, 'big') + i)
  return digest.digest()

def load_key(path: str, what: str = 'shuffling key') -> Optional[bytes]:
  """The secret key stored at `path` (None if there is none yet); `what` names it in errors
  (a run keeps its shuffling key and its canary key this way, both of KEY_BYTES)."""
  try:
    with open(path, 'rb') as f:
      key = f.read()
  except FileNotFoundError:
    return None
  if len(key) != KEY_BYTES:
    raise errors.UserInputError(f'{path} is not a {what} ({len(key)} bytes, expected '
                                f'{KEY_BYTES}); it was damaged, and without it the run cannot '
                                'be resumed.')
  return key

def save_key(path: str, key: bytes) -> None:
  """Stores a secret key at `path`, readable by its owner only, durably (a resume needs it: a
  new shuffling key mid-epoch would let clients participate twice in the epoch; new canary
  directions would break the canary statistics)."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  try:
    os.write(fd, key)
    os.fsync(fd)
  finally:
    os.close(fd)
