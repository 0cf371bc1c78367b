"""TensorFlow's, gRPC's and absl's C++ log lines held back from stderr while a run lasts.

TensorFlow's C++ logger reads `TF_CPP_MIN_LOG_LEVEL` once, at its first line (during
`import tensorflow`), and offers no setter: a library called after TensorFlow is imported cannot
quiet it, and setting the variable before the import would change the caller's process for good.
So `held_back()` puts a pipe in front of file descriptor 2 for the duration of a call and
forwards every line except the native loggers' records, then puts stderr back as it was. Python
warnings, tracebacks and the run's own lines pass through unchanged.

Processes started meanwhile (TFF's workers) inherit the pipe unless given `real_stderr_fd()`:
a worker outlives the call, and a pipe nobody reads would block it (`runtime` does so).
"""

import contextlib
import faulthandler
import os
import re
import sys
import threading
from typing import Iterator, Optional

# A record of TensorFlow's logger ("2026-11-25 23:56:20.354394: I tensorflow/core/...:111] ..."),
# of absl/gRPC's ("I0000 00:00:1700000000.123456   12345 fork_posix.cc:77] ..."), and absl's
# notice before its own initialisation.
NATIVE_RECORD = re.compile(
    rb'^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\] '
    rb'|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\] '
    rb'|WARNING: All log messages before absl::InitializeLog\(\) is called)')
# The lines of TensorFlow's one multi-line record ("This TensorFlow binary is optimized ...").
_CONTINUATION = re.compile(rb'^To enable the following instructions: .* rebuild TensorFlow')

_real_fd: Optional[int] = None   # The stderr a `held_back()` in progress forwards to.


def real_stderr_fd() -> Optional[int]:
  """The file descriptor of the real stderr while `held_back()` lasts, else None."""
  return _real_fd


def is_native_record(line: bytes) -> bool:
  """Whether `line` is a line of TensorFlow's, gRPC's or absl's C++ loggers."""
  return bool(NATIVE_RECORD.match(line) or _CONTINUATION.match(line))


@contextlib.contextmanager
def held_back(enabled: bool = True) -> Iterator[None]:
  """Within the block, stderr lines of the native loggers are dropped and every other line is
  forwarded (whole lines, in order); `enabled=False` changes nothing. Nested calls and
  processes whose stderr is not a file descriptor are left as they are."""
  global _real_fd
  if not enabled or _real_fd is not None or not _has_fd_2():
    yield
    return
  sys.stderr.flush()
  real = os.dup(2)
  read_end, write_end = os.pipe()
  os.dup2(write_end, 2)
  os.close(write_end)
  forwarder = threading.Thread(target=_forward, args=(read_end, real), daemon=True,
                               name='tff_dp-native-logs')
  forwarder.start()
  _real_fd = real
  crash_dumps_moved = _move_crash_dumps(real)   # A fatal signal's dump must not die in the pipe.
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(real, 2)   # Our last reference to the pipe's write end: the forwarder sees its end.
    _real_fd = None
    if crash_dumps_moved:
      faulthandler.enable(file=sys.stderr, all_threads=True)
    forwarder.join(timeout=5)
    if not forwarder.is_alive():   # Else a child holds the pipe: the forwarder still needs it.
      os.close(real)


def _has_fd_2() -> bool:
  try:
    os.fstat(2)
    return sys.stderr is not None and sys.stderr.fileno() == 2
  except (OSError, AttributeError, ValueError):   # ValueError: io.UnsupportedOperation.
    return False


def _move_crash_dumps(fd: int) -> bool:
  if not faulthandler.is_enabled():
    return False
  faulthandler.enable(file=fd, all_threads=True)
  return True


def _forward(read_end: int, real: int) -> None:
  pending = b''
  with os.fdopen(read_end, 'rb', buffering=0) as pipe:
    while chunk := pipe.read(65536):
      *lines, pending = (pending + chunk).split(b'\n')
      _write(real, lines)
  _write(real, [pending] if pending else [])


def _write(fd: int, lines: list[bytes]) -> None:
  kept = b''.join(line + b'\n' for line in lines if not is_native_record(line))
  try:
    while kept:
      kept = kept[os.write(fd, kept):]
  except OSError:   # The real stderr closed under us: nothing left to tell.
    pass
