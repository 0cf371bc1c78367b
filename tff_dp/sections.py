"""How a setting is declared and checked (`setting`, `Section`), and the sections plug-ins add.

A section is a frozen, keyword-only dataclass of settings, each declared once with its type,
default, help and checks (`setting`); `tff_dp.training.config` assembles the run's config from
its own sections and the ones registered here (`register`): a mechanism (`tff_dp.mechanisms`)
or a plug-in such as the repository's `tasks` package declares its settings as its own typed
section, and they become flags, config.json keys and `ExperimentConfig.plugin(cls)` without the
library's config naming them.

Pure Python (no TensorFlow).
"""

import dataclasses
import math
import typing
from typing import Any, Callable, ClassVar, Mapping, Optional

from tff_dp import choices
from tff_dp.errors import UserInputError


def setting(default: Any = dataclasses.MISSING,
            help: str = '', *,  # pylint: disable=redefined-builtin
            default_factory: Any = dataclasses.MISSING, flag: Optional[str] = None,
            one_of: Optional[Mapping[str, str]] = None,
            named_in: Optional[Mapping[str, str]] = None,
            check: Optional[tuple[Callable[[Any], bool], str]] = None,
            resumable: bool = False, path: bool = False):
  """A config field: `help` (library style, parameters in backticks); `flag`: its setting
  name when not the field's name; `one_of`: the allowed values (a `tff_dp.choices` registry);
  `named_in`: a registry plug-ins add to (a live view, name -> meaning): the flag's choices,
  checked where the named thing is built rather than here, since a config may be built before
  the plug-in registers (or for a task object given to the run, whose name is its own);
  `check`: (predicate, requirement) for a value that is set, e.g. (lambda v: v > 0,
  'must be positive'); `resumable`: a resumed run may change it; `path`: a file system path
  (the command line expands `~` in it)."""
  metadata = dict(help=help, flag=flag, one_of=one_of, named_in=named_in, check=check,
                  resumable=resumable, path=path)
  if default_factory is not dataclasses.MISSING:
    return dataclasses.field(default_factory=default_factory, metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


def at_least(low):
  """A `check` for values >= `low`."""
  return (lambda v: v >= low), f'must be >= {low}'


POSITIVE = (lambda v: v > 0), 'must be positive'
NON_NEGATIVE = at_least(0)


def setting_name(field: dataclasses.Field) -> str:
  """The flat name of a field: its flag, its key in config.json and in messages."""
  return field.metadata.get('flag') or field.name


def _describe(value) -> str:
  return repr(value) if isinstance(value, str) else str(value)


def base_type(annotation):
  """(type without Optional, whether None is allowed)."""
  args = typing.get_args(annotation)
  if typing.get_origin(annotation) is typing.Union and type(None) in args:
    return next(a for a in args if a is not type(None)), True
  return annotation, False


def _checked_value(name: str, value, annotation):
  """`value` as the field's type (an int for a float field becomes a float, a list for a tuple
  field a tuple), or UserInputError naming the setting."""
  base, optional = base_type(annotation)
  if value is None:
    if optional:
      return None
    raise UserInputError(f'`{name}` must be set')
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  if base is float:
    if not (number and math.isfinite(value)):
      raise UserInputError(f'`{name}` must be a finite number, got {value!r}')
    return float(value)
  if base is int:
    if not (isinstance(value, int) and not isinstance(value, bool)):
      raise UserInputError(f'`{name}` must be an integer, got {value!r}')
    return value
  if base is bool:
    if not isinstance(value, bool):
      raise UserInputError(f'`{name}` must be true or false, got {value!r}')
    return value
  if base is str:
    if not isinstance(value, str):
      raise UserInputError(f'`{name}` must be a string, got {value!r}')
    return value
  if typing.get_origin(base) is tuple:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
      raise UserInputError(f'`{name}` must be a list, got {value!r}')
    return tuple(value)
  if typing.get_origin(base) is dict or base is dict:
    if not isinstance(value, Mapping):
      raise UserInputError(f'`{name}` must be a mapping, got {value!r}')
    return dict(value)
  raise TypeError(f'config field `{name}` has an unsupported type {annotation}')


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
  """A group of settings; checks each field when built, then the section's own rules.

  A plug-in's section (`register`) also names itself: `SECTION`, its key in
  `ExperimentConfig.plug_ins` and its group in the help, shown after the library's section
  `FOLLOWS`.
  """
  SECTION: ClassVar[str] = ''
  FOLLOWS: ClassVar[str] = ''

  def __post_init__(self):
    hints = typing.get_type_hints(type(self))
    for field in dataclasses.fields(self):
      name = setting_name(field)
      value = _checked_value(name, getattr(self, field.name), hints[field.name])
      object.__setattr__(self, field.name, value)
      allowed, check = field.metadata.get('one_of'), field.metadata.get('check')
      if allowed is not None and value is not None and value not in allowed:
        raise UserInputError(f'`{name}` must be one of {choices.one_of(allowed)}, got '
                             f'{_describe(value)}')
      if check is not None and value is not None and not check[0](value):
        raise UserInputError(f'`{name}` {check[1]}, got {_describe(value)}')
    self._check()

  def _check(self) -> None:
    """Rules between this section's fields (UserInputError)."""


_PLUG_INS: dict[str, type[Section]] = {}
# The library's own section names and setting names, which no plug-in may take
# (`tff_dp.training.config` declares them with `reserve`).
_reserved_names: set[str] = set()
_reserved_settings: set[str] = set()


def register(section: type[Section]) -> None:
  """Adds `section`'s settings to every config built from now on, as the section
  `section.SECTION`.

  Refused (ValueError): a name taken, a setting name another section has, or a resumable
  setting (a plug-in's settings describe the model, data or mechanism, which a resume must not
  change). Registering the same class again does nothing (a re-imported plug-in).
  """
  if not (isinstance(section, type) and issubclass(section, Section) and section.SECTION):
    raise ValueError(f'{section!r} must be a Section subclass that names its SECTION')
  name = section.SECTION
  if _PLUG_INS.get(name) is section:
    return
  if name in _PLUG_INS or name in _reserved_names:
    raise ValueError(f'a config section named {name!r} exists already')
  taken = set(_reserved_settings)
  for cls in _PLUG_INS.values():
    taken.update(setting_name(f) for f in dataclasses.fields(cls))
  for field in dataclasses.fields(section):
    if setting_name(field) in taken:
      raise ValueError(f'section {name!r}: setting `{setting_name(field)}` exists already')
    if field.metadata.get('resumable'):
      raise ValueError(f'section {name!r}: a plug-in\'s setting `{setting_name(field)}` '
                       'cannot be resumable')
  _PLUG_INS[name] = section


def plug_ins() -> dict[str, type[Section]]:
  """{name: section class} of the registered plug-in sections, in registration order."""
  return dict(_PLUG_INS)


def reserve(library: Mapping[str, type[Section]]) -> None:
  """Declares the library's own sections, so that no plug-in takes their names."""
  settings = {setting_name(f) for cls in library.values() for f in dataclasses.fields(cls)}
  for name, cls in _PLUG_INS.items():
    clash = {setting_name(f) for f in dataclasses.fields(cls)} & settings
    if name in library or clash:
      raise ValueError(f'plug-in section {name!r} takes a name of the library\'s: '
                       f'{sorted(clash) or name}')
  _reserved_names.update(library)
  _reserved_settings.update(settings)


def ordered(library: Mapping[str, type[Section]]) -> dict[str, type[Section]]:
  """The library's sections, each followed by the plug-in sections that follow it (in
  registration order); a plug-in following no library section comes last."""
  found = {}
  for name, cls in library.items():
    found[name] = cls
    found.update({n: p for n, p in _PLUG_INS.items() if p.FOLLOWS == name})
  found.update({n: p for n, p in _PLUG_INS.items() if n not in found})
  return found
