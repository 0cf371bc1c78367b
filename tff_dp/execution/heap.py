"""Returns the free pages of this process's C heap to the OS between rounds (glibc).

Over a long run the coordinator's resident memory grew while glibc's `mallinfo2` showed its
allocated bytes flat: a round's transient buffers (TFF values, checkpoint writes, plots) leave
free chunks between live ones, which `free` keeps mapped, since only the top of a heap can be
given back by shrinking it (docs/ENGINEERING_NOTES.md, "Memory over long runs"). glibc's
`malloc_trim(0)` also returns the whole free pages inside every arena (`madvise(DONTNEED)`);
nothing allocated moves and no setting of the allocator changes, so calling it is safe at any
moment no allocation of this process depends on, such as between two rounds.
"""

import ctypes
import ctypes.util
import functools
from typing import Optional


@functools.lru_cache(maxsize=None)
def _malloc_trim() -> Optional[ctypes._CFuncPtr]:
  """glibc's `malloc_trim`, or None where the C library has none (musl, macOS)."""
  name = ctypes.util.find_library('c')
  try:
    return ctypes.CDLL(name).malloc_trim if name else None
  except (OSError, AttributeError):
    return None


def release_free_memory() -> bool:
  """Gives the free pages of this process's heap back to the OS; False where the C library
  cannot (then nothing is done)."""
  trim = _malloc_trim()
  if trim is None:
    return False
  trim(ctypes.c_size_t(0))
  return True
