"""The ledger's value checks: every stored number a plain Python int or finite float, every
bad value one `LedgerError` (a `UserInputError`: one `error:` line, exit 2)."""

import math
import operator
from typing import Any

from tff_dp import errors


class LedgerError(errors.UserInputError):
  """The ledger file or a record is invalid (truncated, edited, bad schema or bad value)."""


def as_float(value: Any, what: str, allow_zero: bool = True) -> float:
  """Casts numpy/TF/Python scalars to a finite non-negative Python float.

  dp_accounting only treats Python `float` as a number (np.float32 is silently mishandled
  when composing Gaussians), so every stored value is a plain float.
  """
  if isinstance(value, (bool, str, bytes)):
    raise LedgerError(f'{what} must be a number, got {type(value).__name__} {value!r}.')
  if hasattr(value, 'numpy'):  # Eager TF tensor.
    value = value.numpy()
  try:
    result = float(value)
  except (TypeError, ValueError):
    raise LedgerError(f'{what} must be a number, got {type(value).__name__} {value!r}.')
  if not math.isfinite(result):
    raise LedgerError(f'{what} must be finite, got {result!r}.')
  if result < 0 or (not allow_zero and result == 0):
    bound = 'positive' if not allow_zero else 'non-negative'
    raise LedgerError(f'{what} must be {bound}, got {result!r}.')
  return result


def as_int(value: Any, what: str, minimum: int) -> int:
  """Casts numpy/Python integers to a Python int >= minimum (bools and floats rejected)."""
  if isinstance(value, bool):
    raise LedgerError(f'{what} must be an integer, got bool {value!r}.')
  if hasattr(value, 'numpy'):
    value = value.numpy()
  try:
    result = operator.index(value)
  except TypeError:
    raise LedgerError(f'{what} must be an integer, got {type(value).__name__} {value!r}.')
  if result < minimum:
    raise LedgerError(f'{what} must be >= {minimum}, got {result}.')
  return int(result)
