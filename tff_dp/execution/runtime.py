# Longer than 350 lines: the execution context's lifecycle, the one thread that forks TFF's
# workers and the environment they start with are one mechanism (who starts a worker, how it
# dies with its parent), read side by side.
"""Lifecycle of TFF's C++ execution context.

TFF 0.87 starts a `worker_binary` subprocess on the first computation. It is only killed in
`ServiceManager.__del__`, which is not reliably run at interpreter exit, and it inherits the
parent's stdout, so a pipe reading our output (CI, `| tee`) never reaches EOF while it lives.
We therefore kill our own worker children explicitly: at exit, on SIGTERM, and on demand
(test fixtures). Children are found through /proc so this does not depend on TFF internals.

None of that runs when this process is killed with SIGKILL (or by the OOM killer), so
`bind_workers_to_this_process` also makes the kernel kill the worker when we die: the worker
is started with Linux's PR_SET_PDEATHSIG = SIGKILL. TFF calls `subprocess.Popen` itself, with
no hook, so we give its module a `Popen` that sets it (the one TFF internal we touch).
"""

import atexit
import ctypes
import gc
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from tff_dp.execution import native_logs

_WORKER_NAME = 'worker_binary'
_installed = False


def schedulable_cores() -> int:
  """The cores this process may run on (its CPU affinity), as TensorFlow counts them."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:   # Not Linux.
    return os.cpu_count() or 1


# Environment variables the worker_binary is started with, on top of this process's own (a
# variable already set in this process's environment wins, so a user can still override them).
# glibc's malloc gives each thread that allocates under contention its own arena, up to 8 per
# core; the worker runs each round's TensorFlow sessions on changing threads of its pools and
# rebuilds a per-cardinality executor almost every round (Poisson sampling), so blocks freed in
# one arena are not reused by the next round's allocations in another and every arena keeps its
# high-water mark: worker RSS grew ~0.9 MiB/round over 500 EMNIST rounds (issue 13, see
# docs/ENGINEERING_NOTES.md "Memory over long runs"). Two arenas halve that growth (0.46 MiB/round) and
# lower the worker's RSS by 300-500 MiB.
#
# TensorFlow sizes the process-wide pool that runs a session's graph nodes (its inter-op pool)
# to the number of cores. The worker runs every client of a call as a session of its own, all
# at once, sharing that pool, and with as many threads as cores it kept only 1.25 of 2 cores
# busy; with twice as many it keeps ~1.55 busy, and rounds take less time at the same CPU
# seconds (docs/ENGINEERING_NOTES.md, "Rounds close to the compute").
DEFAULT_WORKER_ENV = {'MALLOC_ARENA_MAX': '2',
                      'TF_NUM_INTEROP_THREADS': str(2 * schedulable_cores())}
_worker_env: dict[str, str] = dict(DEFAULT_WORKER_ENV)
# The context `configure_execution_context` installed and its executor factory, which
# `restart_local_worker` needs to close every executor before it stops the worker.
_installed_context = None
_installed_factory = None


def _children_of(pid: int) -> list[int]:
  children = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/stat') as f:
        stat = f.read()
    except OSError:
      continue
    # Field 4 (after the parenthesised command name, which may contain spaces) is the ppid.
    ppid = int(stat.rsplit(')', 1)[1].split()[1])
    if ppid == pid:
      children.append(int(entry))
  return children


def _cmdline(pid: int) -> str:
  try:
    with open(f'/proc/{pid}/cmdline', 'rb') as f:
      return f.read().replace(b'\0', b' ').decode(errors='replace')
  except OSError:
    return ''


def rss_mib(pid: int) -> float:
  """Resident memory (VmRSS) of process `pid` in MiB; nan if it is gone. For memory checks of
  a run and its worker (tests/test_memory.py, benchmarks)."""
  try:
    with open(f'/proc/{pid}/status') as f:
      for line in f:
        if line.startswith('VmRSS:'):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return float('nan')


def cpu_seconds(pid: int) -> float:
  """CPU seconds (user + system) process `pid` has used so far; nan if it is gone. For the
  benchmarks' CPU figures of a run and its worker."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
  except OSError:
    return float('nan')
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def worker_pids(parent_pid: int | None = None) -> list[int]:
  """PIDs of live TFF worker binaries started by `parent_pid` (default: this process)."""
  parent_pid = os.getpid() if parent_pid is None else parent_pid
  pids = []
  for pid in _children_of(parent_pid):
    cmd = _cmdline(pid)
    if cmd and os.path.basename(cmd.split(' ', 1)[0]) == _WORKER_NAME:
      pids.append(pid)
  return pids


def _alive(pid: int) -> bool:
  try:
    with open(f'/proc/{pid}/stat') as f:
      state = f.read().rsplit(')', 1)[1].split()[0]
  except OSError:
    return False
  return state != 'Z'


def shutdown_workers(timeout: float = 5.0) -> int:
  """Stops every worker_binary child of this process; returns how many were stopped."""
  pids = worker_pids()
  for pid in pids:
    try:
      os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
      pass
  deadline = time.monotonic() + timeout
  for pid in pids:
    while _alive(pid) and time.monotonic() < deadline:
      time.sleep(0.05)
    if _alive(pid):
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    try:
      os.waitpid(pid, 0)
    except ChildProcessError:
      pass  # Already reaped (by TFF's Popen) or not our child.
  _detach_tff_service_managers()  # None of our workers is alive any more.
  return len(pids)


def restart_local_worker() -> bool:
  """Replaces the local worker_binary by a fresh one, between two computations.

  Why: under Poisson sampling the worker builds an executor stack for almost every round's
  new client count and frees an old one, and its RSS creeps up by ~0.3-1.1 MiB per round even
  with two malloc arenas (docs/ENGINEERING_NOTES.md "Memory over long runs"), 0.5-1.6 GB over
  a 1500-round run. A fresh process returns all of it, so restarting every N rounds bounds the
  worker's memory whatever the cause. Results are unchanged: a TFF call's results are
  materialized Python values and the worker holds no state between calls. The next computation
  starts the new worker (TFF's service manager) and pays a worker start plus the executor's
  set-up once.

  Only for the context `configure_execution_context` installed (it owns the executor factory
  whose executors must be closed first): returns False and does nothing otherwise (remote
  workers, TFF's own default context). Never call it while a computation runs.
  """
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.context_stack import context_stack_impl
  if _installed_factory is None or context_stack_impl.context_stack.current is not (
      _installed_context):
    return False
  _installed_factory.close_all()
  shutdown_workers()
  return True


def _detach_tff_service_managers() -> None:
  """Tells TFF's ServiceManager its worker is gone.

  Its `__del__` would otherwise run during interpreter teardown, when the `subprocess` module
  global is already None, and print a spurious AttributeError traceback. The class is defined
  locally in TFF's `local_cpp_executor_factory`, so we reach it through its live instances;
  each detached instance gets a subclass without `__del__` (TFF's class, and the managers of
  contexts made later, are left as they are).
  """
  for obj in gc.get_objects():
    if type(obj).__name__ == 'ServiceManager' and hasattr(obj, '_process'):
      obj._process = None  # pylint: disable=protected-access
      _close_channel(obj._stub)  # pylint: disable=protected-access
      obj._stub = None  # pylint: disable=protected-access
      if not isinstance(obj, _Detached):
        obj.__class__ = type('ServiceManager', (_Detached, type(obj)), {})


def _close_channel(stub) -> None:
  """Closes the gRPC channel of a stopped worker's stub (TFF's `RemoteExecutorGrpcStub`).

  The stub subscribes to its channel's connectivity, and gRPC keeps a polling thread for each
  subscribed channel until the channel is closed: a stub merely dropped left one thread (and
  the memory it allocated) in this process for every worker restart.
  """
  channel = getattr(stub, '_channel', None)
  if channel is not None:
    channel.close()


class _Detached:
  """Mixed into a detached TFF ServiceManager (its worker is gone): nothing to do at exit."""

  def __del__(self):
    pass


def _on_sigterm(signum, frame):
  del frame
  shutdown_workers()
  # Re-raise as SystemExit so `finally` blocks (ledger/metrics flushes) and atexit still run.
  raise SystemExit(128 + signum)


def install_shutdown_hooks() -> None:
  """Registers the at-exit and SIGTERM worker shutdown (idempotent)."""
  global _installed
  if _installed:
    return
  _installed = True
  atexit.register(shutdown_workers)
  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
    try:
      signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:
      pass  # Not the main thread; atexit still covers normal exit.


_PR_SET_PDEATHSIG = 1   # From <sys/prctl.h>.
try:  # Resolved before any fork: the child only calls it.
  _PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith('linux') else None
except (OSError, AttributeError):
  _PRCTL = None


def _die_with(parent_pid: int):
  """preexec_fn: the child gets SIGKILL when its parent dies (and exits if it already has)."""
  def preexec():
    if _PRCTL is not None:
      _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:   # The parent died between fork and prctl.
      os._exit(1)
  return preexec


class _Spawner:
  """One daemon thread that forks the workers.

  PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process. TFF
  forks from whichever thread runs its context (its event-loop thread, which ends when the
  context is replaced), so we fork from a thread that lives exactly as long as this process.
  """

  def __init__(self):
    self._requests: queue.Queue = queue.Queue()
    threading.Thread(target=self._serve, name='tff_dp-worker-spawner', daemon=True).start()

  def _serve(self):
    while True:
      fn, done = self._requests.get()
      try:
        done.put((fn(), None))
      except BaseException as e:  # pylint: disable=broad-except
        done.put((None, e))

  def call(self, fn):
    done: queue.Queue = queue.Queue(maxsize=1)
    self._requests.put((fn, done))
    result, error = done.get()
    if error is not None:
      raise error
    return result


_spawner = None
_spawner_lock = threading.Lock()


class WorkerPopen(subprocess.Popen):
  """`subprocess.Popen` whose child is killed by the kernel when this process dies."""

  def __init__(self, args, **kwargs):
    global _spawner
    if kwargs.get('preexec_fn') is None:
      kwargs['preexec_fn'] = _die_with(os.getpid())
    kwargs['env'] = worker_environment(kwargs.get('env'))
    # Its own process group: a terminal's Ctrl-C reaches this process alone, which stops the
    # run gracefully. A worker killed by it mid-start-up left TFF waiting for it forever.
    kwargs.setdefault('process_group', 0)
    if native_logs.real_stderr_fd() is not None and _is_fd_2(kwargs.get('stderr')):
      # The worker outlives the held-back call: given its pipe (TFF passes sys.stderr), it kept
      # the pipe open and the call's end waited out the forwarder's timeout (5 s).
      kwargs['stderr'] = native_logs.real_stderr_fd()
    with _spawner_lock:
      if _spawner is None:
        _spawner = _Spawner()
    for _ in range(_SPAWN_ATTEMPTS):
      _spawner.call(lambda: super(WorkerPopen, self).__init__(args, **kwargs))
      if not _killed_at_birth(self):
        return


def _is_fd_2(stream) -> bool:
  """Whether a Popen stdio argument is this process's file descriptor 2 (None inherits it)."""
  if stream is None or stream == 2:
    return True
  try:
    return stream.fileno() == 2
  except (AttributeError, OSError, ValueError):   # ValueError: io.UnsupportedOperation.
    return False


# A forked child can be killed by a signal before it execs the worker: a CI run saw a child
# abort (SIGABRT, faulthandler's dump of the forking thread) between fork and exec, in a process
# full of TensorFlow threads; Popen cannot tell that from a started worker (both close its error
# pipe without a word), and TFF then waits for the dead worker forever. Such a child is reaped
# and the worker started again.
_SPAWN_ATTEMPTS = 3
_BIRTH_SECONDS = 0.05


def _killed_at_birth(process: subprocess.Popen) -> bool:
  """Whether `process` was killed by a signal within _BIRTH_SECONDS of its fork (then it is
  reaped). A worker that exits by itself (e.g. its port is taken) is left as it is."""
  try:
    code = process.wait(timeout=_BIRTH_SECONDS)
  except subprocess.TimeoutExpired:
    return False
  return code < 0 and -code != signal.SIGKILL


def worker_environment(base=None) -> dict[str, str]:
  """The environment a worker is started with: `base` (default: this process's) plus the
  worker settings of `configure_execution_context` that `base` does not set itself."""
  env = dict(os.environ if base is None else base)
  for name, value in _worker_env.items():
    env.setdefault(name, value)
  return env


class _SubprocessWithWorkerPopen:
  """The `subprocess` module as TFF's executor factory sees it, with `WorkerPopen`."""
  Popen = WorkerPopen

  def __getattr__(self, name):
    return getattr(subprocess, name)


def manage_workers() -> None:
  """The one call a program using TFF through this package makes (`tff_dp.run`, the command
  lines and the tests make it; a pipeline that uses only our aggregators makes it itself): no
  TFF worker_binary outlives this process, at exit, on SIGTERM or on SIGKILL
  (`install_shutdown_hooks` and `bind_workers_to_this_process`). Importing the package does
  neither, since both change the whole process (an exit hook, a SIGTERM handler, TFF's
  subprocess module). Idempotent."""
  install_shutdown_hooks()
  bind_workers_to_this_process()


def bind_workers_to_this_process() -> None:
  """Every worker_binary TFF starts from now on dies with this process, even on SIGKILL."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_federated.python.core.impl.executor_stacks import executor_factory
  executor_factory.subprocess = _SubprocessWithWorkerPopen()


def configure_execution_context(*, max_concurrent_computation_calls: int = -1,
                                default_num_clients: int = 0,
                                max_executors: int | None = None,
                                worker_env: dict[str, str] | None = None,
                                client_slices: int = 1) -> None:
  """Installs TFF's local C++ execution context with the given client concurrency.

  The C++ worker runs the clients of a round as concurrent calls of the client computation;
  `max_concurrent_computation_calls` caps how many run at once (<= 0: no cap, TFF's default,
  so all clients of a round run in parallel on the worker's TensorFlow thread pools). A cap
  bounds peak memory with many clients per round at the cost of wall time. Any live worker
  is stopped first: the new context starts its own on the next computation.

  The context is TFF's own (`set_sync_local_cpp_execution_context` builds the same one), but
  its executor factory keeps at most `max_executors` per-cardinality executors alive on the
  worker (default `executor_cache.DEFAULT_MAX_EXECUTORS`); TFF's would leak one per new client
  count, which Poisson sampling draws almost every round (see `tff_dp.execution.executor_cache`).
  Values are sent to the worker serialized in place (`tff_dp.execution.value_transfer`: TFF's
  serializer copies a tensor about three times per struct level around it).

  `worker_env`: environment variables the worker is started with, on top of this process's
  (which win where both set one); None: `DEFAULT_WORKER_ENV` (glibc malloc limited to two
  arenas, which keeps the worker's RSS flat over long runs, and TensorFlow's inter-op pool at
  twice the cores, which keeps them busy), {} for none.

  `client_slices` > 1 runs a round's clients in that many slices one after the other on the
  same worker, through TFF's mergeable-computation context (`num_subrounds`; the context
  `tff_dp.execution.distributed` uses), whose partial aggregates are merged and whose server
  part runs once. The worker holds every client's values of a call until its federated sum (~3.75x the model per
  client: 75 MiB for StackOverflow tag, issue 13.6), so slices bound the round's peak to one
  slice's clients. Same results up to float summation order.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from tff_dp.execution import contexts
  from tff_dp.execution import executor_cache
  global _worker_env, _installed_context, _installed_factory
  shutdown_workers()
  _worker_env = dict(DEFAULT_WORKER_ENV if worker_env is None else worker_env)
  bind_workers_to_this_process()
  factory = executor_cache.BoundedExecutorFactory(
      tff.framework.local_cpp_executor_factory(
          default_num_clients=default_num_clients,
          max_concurrent_computation_calls=max_concurrent_computation_calls),
      max_executors or executor_cache.DEFAULT_MAX_EXECUTORS)
  if client_slices < 1:
    raise ValueError(f'client_slices must be >= 1, got {client_slices}')
  if client_slices > 1:
    context = tff.backends.native.create_mergeable_comp_execution_context(
        [contexts.native_context(tff.framework.AsyncExecutionContext, factory)],
        num_subrounds=client_slices)
  else:
    context = contexts.native_context(tff.framework.SyncExecutionContext, factory)
  tff.framework.set_default_context(context)
  _installed_context, _installed_factory = context, factory
