"""Whole-file writes that readers never see half done: a temporary file beside the target,
fsynced, then renamed over it. A crash or a full disk leaves the previous file intact (the
run directory's config and summaries, rewritten metrics CSVs, result tables, reports)."""

import contextlib
import os
import tempfile
from typing import Iterator, Optional, TextIO


@contextlib.contextmanager
def replacing(path: str, newline: Optional[str] = None, mode: int = 0o644, *,
              binary: bool = False) -> Iterator[TextIO]:
  """Yields a text file (`binary`: a bytes file); when the block ends without error it
  replaces `path` atomically, with permissions `mode` (0o600 for a secret)."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix='.tmp-')
  try:
    with os.fdopen(fd, 'wb' if binary else 'w', newline=None if binary else newline) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, mode)   # mkstemp creates 0600; outputs are meant to be read and copied.
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    raise


def write_text(path: str, text: str, mode: int = 0o644) -> None:
  with replacing(path, mode=mode) as f:
    f.write(text)


def fsync_dir(directory: str) -> None:
  """Makes a newly created or renamed directory entry durable (best effort on filesystems that
  refuse to fsync a directory)."""
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)
