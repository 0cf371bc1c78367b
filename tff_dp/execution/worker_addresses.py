"""The `workers` setting's format: 'hostA:8000,hostB:8000' -> the worker addresses.

Pure Python (no TensorFlow, no gRPC), so a configuration is checked before TF loads; the remote
execution context (`tff_dp.execution.distributed`) connects to what it returns.
"""

from tff_dp.errors import UserInputError


def parse_workers(spec: str) -> list[str]:
  """'hostA:8000,hostB:8000' -> ['hostA:8000', 'hostB:8000'] (UserInputError if malformed)."""
  addresses = [a.strip() for a in spec.split(',') if a.strip()]
  if not addresses:
    raise UserInputError('`workers` needs at least one host:port')
  for a in addresses:
    host, sep, port = a.rpartition(':')
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
      raise UserInputError(f'`workers`: expected host:port, got {a!r}')
  if len(set(addresses)) != len(addresses):
    raise UserInputError(f'`workers` lists a worker twice: {spec!r}')
  return addresses
