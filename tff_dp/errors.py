"""User-facing error type: bad input that the CLI reports as one line and exit code 2."""


class UserInputError(ValueError):
  """A configuration or input problem the user can fix; the message says what to change."""
