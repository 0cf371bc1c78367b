"""The tasks `tff_dp.run` builds by name (the `task` setting): registered by the packages that
define them, never imported by the library.

The repository's `tasks` package registers EMNIST and the StackOverflow tasks when it is
imported (the command line imports it); a user's package registers its own the same way, or
passes a task object to `tff_dp.run` (`task_protocol`). Pure Python (no TensorFlow).
"""

import dataclasses
import os
from typing import Any, Callable, Mapping, Optional

from tff_dp import choices
from tff_dp.errors import UserInputError

# Where a registered task's embedded dataset is generated when no data directory is given (the
# `embedded_data_dir` setting's default).
DEFAULT_EMBEDDED_DATA_DIR = os.path.join('data_cache', 'embedded')


@dataclasses.dataclass(frozen=True)
class RegisteredTask:
  """A task the run builds from its settings.

  `build(data_dir, *, embedded_data_dir, client_batch_size, client_epochs,
  max_elements_per_client, shuffle_seed, **options)` returns a task (`task_protocol`) from the
  TFF cache in `data_dir`, or from an embedded dataset in `embedded_data_dir` when `data_dir`
  is None. `check_data(data_dir, **options)` refuses (UserInputError) a data directory the task
  cannot read, without TensorFlow, so the command line refuses it before anything is written.
  `client_ids(data_dir, *, embedded_data_dir, **options)` refuses the data as `check_data` does
  (so the command line calls one or the other), then returns the (training, test) client ids
  `build` would load, in its order, read without TensorFlow, or None when they are not known
  before the task is built (an embedded dataset not generated yet); the command line then checks
  the population's size before TensorFlow (`population.check_before_the_run`).
  `token_side_info`: the token-frequency side information (`side_info=word_freq|tag_freq`) the
  task has public counts and a model for (None: not declared, found out when it is built).
  `options` maps each of the builder's own keywords to the flat setting that gives it (a
  setting of a plug-in section, `tff_dp.sections.register`).
  """
  help: str
  build: Callable[..., Any]
  check_data: Optional[Callable[..., None]] = None
  client_ids: Optional[Callable[..., Optional[tuple[list, list]]]] = None
  token_side_info: Optional[frozenset[str]] = None
  options: Mapping[str, str] = dataclasses.field(default_factory=dict)


_TASKS: dict[str, RegisteredTask] = {}


# The `task` setting's choices, name -> meaning (a task registered later too).
CHOICES = choices.LiveChoices(lambda: _TASKS, lambda name: _TASKS[name].help)


def register(name: str, task: RegisteredTask) -> None:
  """Makes `name` a choice of the `task` setting, built by `task`; ValueError if another task
  has the name (registering an equal entry under it again does nothing)."""
  if _TASKS.get(name, task) != task:
    raise ValueError(f'a task named {name!r} is registered already')
  _TASKS[name] = task


def get(name: str) -> RegisteredTask:
  """The registered task `name`; UserInputError naming the registered ones otherwise."""
  if name not in _TASKS:
    known = (f'the registered tasks are {choices.one_of(_TASKS)}' if _TASKS else
             'no task is registered (import the package that registers it, such as the '
             'repository\'s `tasks`)')
    raise UserInputError(f'unknown `task` {name!r}: {known}; a task object given to the run '
                         'needs no registration')
  return _TASKS[name]


def is_registered(name: str) -> bool:
  """Whether the run builds task `name` itself (else the task is a user's object)."""
  return name in _TASKS
