"""What an aggregator reports, declared by the factory that reports it.

Every top-level key of an aggregation process's measurements is declared by the factory whose
`create` adds it: what it holds, and whether the DP guarantee covers it. Covered: computed only
from noised values and from query state the mechanism already released (post-processing), so
it may be published. Not covered: it counts clients without noise (a non-private diagnostic).

A factory declares through a `measurements()` method returning `Measurement`s. A wrapper
declares its own keys and those of the factory it wraps (`declared(inner)`); a key that holds a
wrapped factory's measurements one level down declares them as its `inner`. The metrics columns
`aggregator/<key>/...` take their coverage from these declarations
(`tff_dp.run_format.columns`), and a process that reports a measurement no declaration names is
refused where it is built (`check`), before the run writes anything.
"""

import dataclasses
from typing import Iterable, Optional, Sequence

from tff_dp import errors


@dataclasses.dataclass(frozen=True)
class Measurement:
  """One key of a process's measurements.

  key: the key, as the process reports it.
  meaning: what its values are (the statement and the docs show it).
  covered: the DP guarantee covers every value under the key.
  inner: the key holds a wrapped factory's measurements (their declarations), one level down;
    then `covered` is not used.
  """
  key: str
  meaning: str
  covered: bool = False
  inner: Optional[tuple['Measurement', ...]] = None


def declared(factory) -> tuple[Measurement, ...]:
  """What `factory` declares it reports (its `measurements()`); () for a factory that declares
  nothing (TFF's own, whose measurements a wrapper of ours declares)."""
  declare = getattr(factory, 'measurements', None)
  return tuple(declare()) if callable(declare) else ()


def find(declarations: Sequence[Measurement], path: Sequence[str]) -> Optional[Measurement]:
  """The declaration a measurement at `path` (its keys, top-level first) falls under, or None
  if none names it."""
  if not path:
    return None
  found = next((m for m in declarations if m.key == path[0]), None)
  if found is not None and found.inner is not None:
    return find(found.inner, path[1:])
  return found


def is_covered(declarations: Sequence[Measurement], path: Sequence[str]) -> bool:
  """Whether the guarantee covers the measurement at `path`; KeyError if undeclared."""
  found = find(declarations, path)
  if found is None:
    raise KeyError(f'aggregator measurement {"/".join(path)!r} is not declared by the factory '
                   'that reports it (tff_dp.measurements)')
  return found.covered


def check(declarations: Sequence[Measurement], reported: Iterable[Sequence[str]]) -> None:
  """Refuses (RunFailedError) a process whose `reported` measurement paths (each a sequence of
  keys, down to a value) are not all declared."""
  missing = sorted({'/'.join(path) for path in reported if find(declarations, path) is None})
  if missing:
    raise errors.RunFailedError(
        f'the model aggregator reports measurements no factory declares: {", ".join(missing)} '
        '(declare each in the measurements() of the factory that adds it, tff_dp.measurements)')


def flattened(declarations: Sequence[Measurement], prefix: str = '') -> list[Measurement]:
  """The declarations with nested ones lifted to the top, keyed by their path ('a/b')."""
  out = []
  for m in declarations:
    key = f'{prefix}{m.key}'
    if m.inner is not None:
      out.extend(flattened(m.inner, f'{key}/'))
    else:
      out.append(dataclasses.replace(m, key=key))
  return out
