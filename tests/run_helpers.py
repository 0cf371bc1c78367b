"""Running the project's scripts as a user does (a fresh interpreter on this checkout), or their
`main` in this process where the process boundary is not what a test checks, and reading back
what a run wrote; shared by the tests that drive the CLIs end to end."""

import contextlib
import csv
import io
import os
import sys
import uuid

from tff_dp.run_format import console   # No TensorFlow.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script(name: str) -> list[str]:
  """Command prefix running REPO/`name` (e.g. 'run_experiment.py') with this interpreter."""
  return [sys.executable, os.path.join(REPO, name)]


def script_env() -> dict[str, str]:
  """This environment, with the checkout importable and TF's C++ start-up noise off."""
  return dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='3')


class _Captured(io.StringIO):
  """What a command prints, kept; the processes it starts (TFF's worker, given this stream)
  write to the stream's file descriptor instead."""

  def __init__(self, stream):
    super().__init__()
    self._fileno = stream.fileno

  def fileno(self):
    return self._fileno()


@contextlib.contextmanager
def captured_stdout():
  """What the block prints (`.getvalue()`); TFF workers it starts write to the real stdout."""
  out = _Captured(sys.stdout)
  with contextlib.redirect_stdout(out):
    yield out


def main_in_process(name: str, args: list[str]) -> tuple[int, str, str]:
  """(exit code, stdout, stderr) of REPO/`name`'s `main` (e.g. 'run_experiment.py') called in
  this process with `args`: the command line as `script(name) + args` runs it, without a fresh
  interpreter's TensorFlow import and TFF start-up. For tests of what the command does, not of
  its process (signals, exit on a kill, a worker left behind: those start `script(name)`)."""
  module = __import__(name[:-len('.py')])
  out, err = _Captured(sys.stdout), _Captured(sys.stderr)
  context = _tff_context()
  try:
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      code = module.main([name] + list(args))
  finally:
    # The command may have installed another TFF context (--workers, --client_slices): the
    # tests after it get the local one back. Only then: reinstalling stops the worker and
    # scans the heap for TFF's service managers (0.15 s with TensorFlow loaded).
    if 'tensorflow_federated' in sys.modules and _tff_context() is not context:
      from tff_dp.execution import runtime  # pylint: disable=g-import-not-at-top
      runtime.configure_execution_context()
  return code, out.getvalue(), err.getvalue()


def _tff_context():
  """TFF's current execution context, or None before TFF is imported."""
  if 'tensorflow_federated' not in sys.modules:
    return None
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  return context_stack_impl.context_stack.current


# Set in the environment of the programs a test starts; every process they start (TFF's
# worker_binary included) inherits it, whatever happens to its parent.
_TAG_VARIABLE = 'TFF_DP_TEST_TAG'


def tagged_env() -> tuple[dict[str, str], str]:
  """(`script_env()` plus a fresh tag, the tag), for `tagged_workers`."""
  tag = uuid.uuid4().hex
  return dict(script_env(), **{_TAG_VARIABLE: tag}), tag


def tagged_workers(tag: str) -> set[int]:
  """Live TFF worker binaries started under `tag` (see `tagged_env`): this test's workers only,
  never those of other programs on the machine."""
  marker = f'{_TAG_VARIABLE}={tag}'.encode()
  pids = set()
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        program = f.read().split(b'\0', 1)[0]
      with open(f'/proc/{entry}/environ', 'rb') as f:
        environ = f.read().split(b'\0')
      with open(f'/proc/{entry}/stat') as f:
        state = f.read().rsplit(')', 1)[1].split()[0]
    except OSError:   # Gone, or another user's process (not ours).
      continue
    if os.path.basename(program) == b'worker_binary' and marker in environ and state != 'Z':
      pids.add(int(entry))
  return pids


def metrics_rows(run_dir) -> list[dict[str, str]]:
  """The rows of RUN_DIR/metrics.csv as written (strings)."""
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))


def run_stopped_after(settings: dict, task, name: str, *, resume: bool = False,
                      stop_after=None):
  """`experiment.run` of `settings` on `task` in ROOT/`name` (this process), stopped as a
  SIGTERM between rounds stops it once round `stop_after` has run (None: runs to the end)."""
  # pylint: disable=g-import-not-at-top  (TensorFlow: only for the tests that run)
  import signal
  from tff_dp.training import config as config_lib
  from tff_dp.training import experiment
  from tff_dp.training.run_state import stop_signal
  stop = stop_signal.StopSignal(lambda s: None)

  def log(line):
    if stop_after is not None and line.startswith(f'round {stop_after:>4d}/'):
      stop.received = signal.SIGTERM   # As the handler records a signal.
  cfg = config_lib.ExperimentConfig.from_settings(settings, experiment_name=name, resume=resume)
  return experiment.run(cfg, task, log=log, stop=stop)


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
  x = (x + 0x9E3779B97F4A7C15) & _MASK64
  x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
  x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
  return x ^ (x >> 31)


def seeded_draw(seed: int, round_num: int, client_id) -> float:
  """A seeded sampler's uniform for `client_id` in `round_num`, as tff_dp.sampling documents it,
  in plain Python integers (an oracle independent of its numpy code): SplitMix64 twice of the
  id's BLAKE2b word XOR the round's SHA-256 word, its top 53 bits."""
  import hashlib  # pylint: disable=g-import-not-at-top
  word = int.from_bytes(hashlib.blake2b(b'tff_dp.sampling seeded\0' + str(client_id).encode(),
                                        digest_size=8).digest(), 'big')
  rnd = int.from_bytes(hashlib.sha256(b'tff_dp.sampling seeded round %d %d'
                                      % (seed, round_num)).digest()[:8], 'big')
  return (_splitmix64(_splitmix64(word ^ rnd)) >> 11) * 2.0**-53


def kept_figures(monkeypatch) -> list:
  """The figures the package's plots draw, in order, kept to read (they are drawn without
  pyplot, each from `plot_axes.new_axes`)."""
  from tff_dp import plot_axes  # pylint: disable=g-import-not-at-top
  kept, make = [], plot_axes.new_axes

  def recording(figsize):
    fig, ax = make(figsize)
    kept.append(fig)
    return fig, ax
  monkeypatch.setattr(plot_axes, 'new_axes', recording)
  return kept


def round_of(line: str):
  """The round of a round's console line (`run_format.console`); None for any other line."""
  round_line = console.parse_round_line(line)
  return None if round_line is None else round_line.round_num
