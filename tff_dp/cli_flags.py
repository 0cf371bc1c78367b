"""Parsing for the package's small command lines (`python -m tff_dp.accounting`, `.tables`).

They parse their own `absl.flags.FlagValues` instead of `absl.app.run` (which would own the
process, parse the global FLAGS and offer no way to report bad input as one `error:` line with
exit code 2), so `--help` is handled here: the module's usage text and every flag with its help.
"""

import atexit
import os
import re
import signal
import sys
from typing import Callable, Collection, Mapping, NoReturn, Optional, Sequence

from absl import flags

from tff_dp import errors

HELP_FLAGS = ('--help', '-h', '--helpshort', '--helpfull', '-?')


def parse(flag_values: flags.FlagValues, argv: list[str], usage: str) -> Optional[int]:
  """Parses `argv` into `flag_values`; returns 0 after printing help if it was asked for.

  Raises UserInputError for an unknown flag, a bad value or a stray positional argument.
  """
  if any(a in HELP_FLAGS for a in argv[1:]):
    lines = flag_values.get_help(include_special_flags=False).splitlines()
    flag_help = '\n'.join(l for l in lines if not l.endswith('.py:'))   # Drop module headers.
    print(f'{usage.strip()}\n\nflags:\n{flag_help.strip(chr(10))}')
    return 0
  try:
    flag_values.unparse_flags()   # main() may run several times in one process (tests).
    extra = flag_values(argv)[1:]
  except flags.Error as e:
    raise errors.UserInputError(str(e)) from None
  if extra:
    raise errors.UserInputError(f'unexpected arguments {extra}')
  return None


def path(value: Optional[str]) -> Optional[str]:
  """A path as the user typed it, with `~` expanded (shells leave `--flag=~/x` alone)."""
  return None if value is None else os.path.expanduser(value)


# A parameter as library messages name it: `name` or `name=value` (see tff_dp.errors).
_PARAMETER = re.compile(r'`([A-Za-z_]\w*)(=[^`]*)?`')


def numbers(flag_values: flags.FlagValues, name: str, cast: Callable) -> list:
  """The list flag `name`'s values as numbers (UserInputError naming the flag otherwise)."""
  try:
    return [cast(v) for v in flag_values[name].value or ()]
  except ValueError:
    raise errors.UserInputError(f'--{name} must be a comma-separated list of numbers, got '
                                f'{",".join(flag_values[name].value)}.') from None


def refuse_unchosen(flag_values: flags.FlagValues,
                    modes: Mapping[str, tuple[bool, Sequence[str]]]) -> None:
  """UserInputError for a flag of a mode that was not chosen (`modes`: the mode's flag ->
  (whether it was chosen, the flags only it reads)): the flag would be ignored."""
  for mode, (chosen, names) in modes.items():
    given = [name for name in names if flag_values[name].present]
    if given and not chosen:
      raise errors.UserInputError(f'--{given[0]} is a setting of --{mode}, which was not '
                                  f'given: it would be ignored; drop it or give --{mode}.')


def as_flags(message: str, flag_names: Collection[str]) -> str:
  """`message` as a command-line user reads it: each parameter the library names in backticks
  (`clip`, `dp=fixed`) that is one of `flag_names` becomes that flag (--clip, --dp=fixed);
  any other backticked text is left as it is."""
  def flag(match):
    name, value = match.group(1), match.group(2) or ''
    return f'--{name}{value}' if name in flag_names else match.group(0)
  return _PARAMETER.sub(flag, message)


def report(error: Exception, flag_names: Collection[str] = ()) -> int:
  """Prints the one `error:` line for bad input (parameters named as `flag_names`' flags)
  and returns the exit code 2."""
  print(f'error: {as_flags(" ".join(str(error).split()), flag_names)}', file=sys.stderr)
  return 2


def interruptible() -> None:
  """Makes the first Ctrl-C (SIGINT) raise KeyboardInterrupt and SIGTERM end the program
  (SystemExit 128 + 15, so `finally` blocks run) in this process, even when it was started with
  them ignored (a shell's background job inherits SIGINT ignored, and Python keeps an inherited
  SIG_IGN): each command line's main calls it, never an import. A program that execs another
  (the worker) passes these dispositions on as the default ones."""
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, _terminate)


def _terminate(signum, frame):
  del frame
  raise SystemExit(128 + signum)


def run_program(main, argv, kept: str) -> int:
  """`main(argv)` as a program (`interruptible`): the first Ctrl-C ends it with exit code 130
  and one line saying what was kept (`kept`)."""
  interruptible()
  try:
    return main(argv)
  except KeyboardInterrupt:
    print(f'stopped by SIGINT (Ctrl-C): {kept}', file=sys.stderr)
    return 130


def exit_now(code: int) -> NoReturn:
  """Ends this process with `code` after its at-exit handlers (TFF workers stopped, logs
  flushed) and a flush of stdout and stderr, without the interpreter's teardown.

  Why: once a TensorFlow program has written and closed its last output, tearing down
  TensorFlow's modules and native state still takes about 2 s on an idle 2-core machine, and
  several times that under load, while a stopped run must end within seconds of its Ctrl-C.
  Only for a command's last line, when every file it wrote is closed.
  """
  atexit._run_exitfuncs()   # pylint: disable=protected-access  (the public hook is exit itself)
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):   # A closed pipe: nothing left to say on it.
      pass
  os._exit(code)   # pylint: disable=protected-access
