"""Graceful stop on SIGINT/SIGTERM: finish (or abandon) the current round, checkpoint, exit.

The first signal only sets a flag; the loop checks it between rounds and stops after writing a
checkpoint that matches the ledger, so the round under way completes (TFF's worker has its own
process group: a terminal's Ctrl-C does not reach it). A round whose TFF call fails after the
signal (e.g. the worker was killed too) releases nothing: its ledger record is only written
after the round returns. A second signal aborts at once (the ledger stays valid, see
`tff_dp.ledger`). While nothing of the run is written, a program may end at the first signal
(`end_start_up`): there is nothing to keep.

The abort is an exception raised by the handler in whatever Python code the main thread runs.
When that is a finalizer (a weakref callback, `__del__`, a collector callback), Python prints
the exception as "Exception ignored in ..." and goes on, and the abort would be lost: while the
handlers are installed, such an abort is sent again (the same signal, from another thread),
and the handler raises it anew in the code that runs next.
"""

import signal
import sys
import threading
from typing import Callable, Optional

from tff_dp import errors
from tff_dp.execution import runtime

# How long after an abort was dropped in a finalizer it is sent again.
_RESEND_SECONDS = 0.05


class StopSignal:
  """Context manager installing the handlers (main thread only; elsewhere a no-op)."""

  SIGNALS = (signal.SIGINT, signal.SIGTERM)

  def __init__(self, log: Callable[[str], None] = print, *,
               end_start_up: Optional[Callable[[int], None]] = None):
    """`end_start_up(signum)`: what any signal does while nothing of the run is written (no
    run directory, no round), after stopping the workers: a command line ends its process
    there, since nothing is lost and the next step of start-up at which a flag is seen can be
    seconds away (TensorFlow's import, building the task: a CI run saw more than 10 s), and a
    KeyboardInterrupt raised inside TensorFlow's import can be swallowed. None (a library
    caller), or a callback that returns: the first signal is a flag, turned into
    `errors.RunInterrupted` at the next step of start-up (`raise_if_received`), and a second
    raises KeyboardInterrupt (SIGINT) or SystemExit."""
    self.received: Optional[int] = None
    self._end_start_up = end_start_up
    self.rounds_started = False   # Set by the round loop: what a stop means changes then.
    # Set once the run directory is written (before round 1): a stop then leaves it behind.
    self.run_dir: Optional[str] = None
    self._log = log
    self._previous = {}
    self._previous_unraisablehook = None
    self._aborting: Optional[int] = None   # The signal of an abort under way.

  @property
  def name(self) -> Optional[str]:
    return None if self.received is None else signal.Signals(self.received).name

  def raise_if_received(self, when: str) -> None:
    """Raises `errors.RunInterrupted` if a signal arrived (used before round 1)."""
    if self.received is not None:
      raise errors.RunInterrupted(self.received, stopped_line(self.received, when))

  def _handle(self, signum, frame):
    del frame
    if self.run_dir is None and not self.rounds_started and self._end_start_up:
      runtime.shutdown_workers()   # Started by a computation built during start-up, if any.
      self._end_start_up(signum)
    if self.received is not None:   # Second signal: stop now, and the round with it.
      # TFF's worker has its own process group, so the signal did not reach it: stop it here,
      # or exiting would wait for the round it computes (TFF's thread is not a daemon).
      runtime.shutdown_workers()
      self._aborting = signum
      if signum == signal.SIGINT:
        raise KeyboardInterrupt
      raise SystemExit(128 + signum)
    self.received = signum
    if self.rounds_started:
      self._log(f'{signal.Signals(signum).name}: stopping after the current round, with a '
                'checkpoint; send it again to abort the round (the rounds before it are kept)')
    elif self.run_dir is not None:
      self._log(f'{signal.Signals(signum).name}: stopping before round 1; {self.run_dir} holds '
                'the run\'s settings and keys (no round): continue it with `resume`; send the '
                'signal again to abort now')
    else:
      self._log(f'{signal.Signals(signum).name}: stopping at the next step of start-up (no '
                'round has started; nothing of the run is written); send it again to abort now')

  def install(self) -> 'StopSignal':
    """Installs the handlers until `__exit__` (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is threading.main_thread():
      for s in self.SIGNALS:
        self._previous[s] = signal.signal(s, self._handle)
      self._previous_unraisablehook = sys.unraisablehook
      sys.unraisablehook = self._unraisable
    return self

  def _unraisable(self, unraisable) -> None:
    """An abort raised inside a finalizer, which Python would print and drop: sent again,
    shortly, from another thread, so that the handler runs after this hook and the finalizer
    returned (sent from here, it would run inside this hook and be dropped again; should it
    land in a finalizer again, it comes back here)."""
    if (self._aborting is not None
        and isinstance(unraisable.exc_value, (KeyboardInterrupt, SystemExit))):
      # A real signal, not `_thread.interrupt_main`: it also ends a wait the main thread is in.
      resend = threading.Timer(_RESEND_SECONDS, signal.pthread_kill,
                               args=(threading.main_thread().ident, self._aborting))
      resend.daemon = True
      resend.start()
      return
    self._previous_unraisablehook(unraisable)

  def __enter__(self):
    return self.install()

  def __exit__(self, *exc):
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}
    if self._previous_unraisablehook is not None:
      sys.unraisablehook = self._previous_unraisablehook
      self._previous_unraisablehook = None
    return False


def stopped_line(signum: int, when: str = 'during start-up') -> str:
  """What a stop before anything of the run is written says (`when`: at which step)."""
  return f'stopped by {signal.Signals(signum).name} {when}; nothing of the run was written'
