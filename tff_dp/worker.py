"""Starts one TFF worker (the C++ `worker_binary` shipped in the TFF wheel) on this machine.

  python -m tff_dp.worker --port 8000 [--max_concurrent_computation_calls -1]

Run one per machine (or several per machine on different ports), then point the experiment at
them: `run_experiment.py --workers=hostA:8000,hostB:8000`. The process *becomes* the worker
(exec), so signals and exit codes are the worker's own; stop it with Ctrl-C / SIGTERM.
The worker speaks TFF's executor-service gRPC protocol, unauthenticated and on all interfaces
([::]:PORT): run it only on a trusted network (or firewall the port).
"""

import importlib.util
import os
import socket
import sys

from absl import flags

from tff_dp import cli_flags
from tff_dp import errors

# The flags of this command, as the other command lines of the package (absl, `cli_flags`).
FLAGS = flags.FlagValues()
flags.DEFINE_integer('port', None, 'TCP port to serve on (1..65535). Required.',
                     lower_bound=1, upper_bound=65535, flag_values=FLAGS)
flags.DEFINE_integer('max_concurrent_computation_calls', -1,
                     'Clients this worker trains concurrently (<= 0: no limit).',
                     flag_values=FLAGS)


def worker_binary_path() -> str:
  """The worker binary of the installed TFF wheel (found without importing TF/TFF: fast)."""
  spec = importlib.util.find_spec('tensorflow_federated')
  if spec is None or not spec.submodule_search_locations:
    return ''
  return os.path.join(list(spec.submodule_search_locations)[0], 'data', 'worker_binary')


def main(argv=None) -> int:
  """argv (program name first; default sys.argv) -> exit code (2: bad input); on success the
  process becomes the worker and does not return."""
  try:
    if cli_flags.parse(FLAGS, list(sys.argv if argv is None else argv), __doc__) == 0:
      return 0
    if FLAGS.port is None:
      raise errors.UserInputError('--port is required (the TCP port to serve on).')
  except errors.UserInputError as e:
    return cli_flags.report(e, FLAGS)
  args = FLAGS
  with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as probe:
    # SO_REUSEADDR as gRPC's server sets it: a port whose previous worker died keeps its
    # connections in TIME_WAIT for a minute, which must not block a restart; a live listener
    # still refuses the bind.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(('', args.port))
    except OSError as e:
      print(f'error: port {args.port} is not available: {e.strerror}', file=sys.stderr)
      return 2
  binary = worker_binary_path()
  if not os.path.isfile(binary):
    print(f'error: TFF worker binary not found at {binary}', file=sys.stderr)
    return 2
  print(f'tff_dp worker: serving on port {args.port} ({socket.gethostname()}:{args.port})',
        flush=True)
  # /proc and environment helpers only: imports no TensorFlow.
  # pylint: disable-next=g-import-not-at-top
  from tff_dp.execution import runtime
  # The same environment as a local worker (glibc malloc arenas capped: flat RSS, issue 13).
  os.execve(binary, [binary, f'--port={args.port}',
                     f'--max_concurrent_computation_calls={args.max_concurrent_computation_calls}'],
            runtime.worker_environment())
  return 0  # Not reached.


if __name__ == '__main__':
  # The worker binary inherits handled signals as default ones (Ctrl-C ends it), and ignored
  # ones as ignored (a background job's SIGINT).
  cli_flags.interruptible()
  sys.exit(main())
