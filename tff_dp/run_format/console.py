"""The console's line per round: how it starts and ends (written by the training report's
`console_line`) and how a tool that follows a run as it goes reads it back (the soak and
round-time benchmarks, the memory test). The line is printed after every output of its round,
so a reader that sees it may inspect the round's files and processes."""

import dataclasses
import re
from typing import Optional

# 'round   25/30  ...  4.17s': the round first, the round's wall seconds last (if timed).
_LINE = re.compile(r'^round\s+(\d+)/(\d+)(?:\s.*?)?(?:\s(\d+\.\d+)s)?\s*$')


def round_field(round_num: int, total_rounds: int) -> str:
  """The line's first field."""
  return f'round {round_num:>4d}/{total_rounds}'


def seconds_field(round_seconds: float) -> str:
  """The line's last field: the round's wall time."""
  return f'{round_seconds:.2f}s'


@dataclasses.dataclass(frozen=True)
class RoundLine:
  """What a reader takes from a round's line (`round_seconds` None: the round was not timed)."""
  round_num: int
  total_rounds: int
  round_seconds: Optional[float]


def parse_round_line(line: str) -> Optional[RoundLine]:
  """The round's line `line` read back; None for any other line of the console (log lines,
  including those that name a round, such as 'round 5: client 3 skipped')."""
  match = _LINE.match(line)
  if match is None:
    return None
  seconds = match.group(3)
  return RoundLine(int(match.group(1)), int(match.group(2)),
                   None if seconds is None else float(seconds))
