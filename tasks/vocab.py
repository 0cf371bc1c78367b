"""StackOverflow word and tag counts: TFF's loaders, or the same files extracted offline.

`tff.simulation.datasets.stackoverflow.load_word_counts/load_tag_counts(cache_dir)` fetch a
`.tar.bz2` via `tf.keras.utils.get_file` with a fixed sha256, extract it into
`<cache_dir>/datasets/` and parse `stackoverflow.word_count` / `stackoverflow.tag_count`
("token count" per line, most frequent first). A generated archive can never match that hash,
so Keras would try to re-download it. Hence: when the real archive is present we call TFF's
loader unchanged; otherwise we parse the extracted file that TFF would have parsed, from the same
location and in the same format (which is what our synthetic caches ship).
"""

import collections
import hashlib
import os
from typing import Optional

import tensorflow_federated as tff

from tff_dp.errors import UserInputError


# The sha256 TFF passes to `get_file`; a mismatching archive would make Keras re-download it.
_ARCHIVE_SHA256 = {
    'word': '1dc00256d6e527c54b9756d968118378ae14e6692c0b3b6cad470cdd3f0c519c',
    'tag': '6fe281cec490d9384a290d560072438e7e2b377bbb823876ce7bd6f82696772d',
}


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()


def _paths(cache_dir: str, kind: str):
  base = os.path.join(cache_dir, 'datasets')
  return (os.path.join(base, f'stackoverflow.{kind}_count.tar.bz2'),
          os.path.join(base, f'stackoverflow.{kind}_count'))


def parse_counts_file(path: str, limit: Optional[int] = None) -> collections.OrderedDict:
  """Parses TFF's "token count" file format (same parsing as TFF's loaders)."""
  counts = collections.OrderedDict()
  with open(path) as f:
    for line_num, line in enumerate(f, 1):
      parts = line.split()
      if len(parts) != 2 or not parts[1].isdigit():
        raise UserInputError(f'{path} line {line_num}: expected "token count", got {line!r}')
      counts[parts[0]] = int(parts[1])
      if limit is not None and len(counts) >= limit:
        break
  return counts


def _load(cache_dir: str, kind: str, limit: Optional[int]):
  archive, extracted = _paths(cache_dir, kind)
  if os.path.exists(archive):
    if _sha256(archive) != _ARCHIVE_SHA256[kind]:
      raise UserInputError(f'{archive} does not match TFF\'s sha256 (corrupt or truncated); '
                           'delete it or replace it with the original; no download is attempted')
    if kind == 'word':
      return tff.simulation.datasets.stackoverflow.load_word_counts(
          cache_dir=cache_dir, vocab_size=limit)
    counts = tff.simulation.datasets.stackoverflow.load_tag_counts(cache_dir=cache_dir)
    return collections.OrderedDict(list(counts.items())[:limit] if limit else counts.items())
  if os.path.exists(extracted):
    return parse_counts_file(extracted, limit)
  raise UserInputError(f'StackOverflow {kind} counts not found: expected {archive} (TFF\'s '
                       f'download) or {extracted}; no download is attempted')


def load_word_counts(cache_dir: str, vocab_size: Optional[int] = None):
  return _load(cache_dir, 'word', vocab_size)


def load_tag_counts(cache_dir: str, tag_vocab_size: Optional[int] = None):
  return _load(cache_dir, 'tag', tag_vocab_size)
