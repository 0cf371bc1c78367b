"""User-facing error types: bad input that the CLI reports as one line and exit code 2.

Library messages name the parameter to change in backticks, as a Python caller passes it
(`clip`, `dp=fixed`), never as a command-line flag: the entry points print them with
`tff_dp.cli_flags.as_flags`, which turns the parameters that are flags of that command into
`--clip`, `--dp=fixed`.
"""


class UserInputError(ValueError):
  """A configuration or input problem the user can fix; the message says what to change."""


class RunFailedError(RuntimeError):
  """A run stopped by a fault outside the user's configuration (a failed round, a full disk).

  The message names the fault and states what on disk is intact; the CLI prints it as one line
  and exits with code 1. The run directory stays consistent, so `--resume` continues it.
  """


class RunInterrupted(Exception):
  """A stop signal (SIGINT/SIGTERM) ended a run before it could stop between rounds: during
  start-up (nothing was written), or a second signal during a round (the completed rounds
  were checkpointed). The message says what was kept.

  `signum` is the signal; the CLI exits with 128 + signum after one line.
  """

  def __init__(self, signum: int, message: str):
    super().__init__(message)
    self.signum = signum
