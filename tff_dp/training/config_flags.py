"""Command-line flags generated from the config's fields, and flags -> `ExperimentConfig`.

One flag per field of `tff_dp.training.config`, under the setting's flat name (`--clip`,
`--dp`, ...), so every flag file in experiments/ keeps working; its type, default, help and
choices come from the field. Each section's flags are registered under the section's name,
which is how absl groups them in the help (`help_text`).

Imports no TensorFlow: `parse` reports a bad command line before TF is loaded.
"""

import dataclasses
import os
import typing
from typing import Any, Mapping, Optional, Sequence

from absl import flags

from tff_dp import choices
from tff_dp import cli_flags
from tff_dp import errors
from tff_dp.training import config as config_lib
from tff_dp.training import preflight
from tff_dp import sections


def _parse_key_values(items: Sequence[str]) -> dict[str, float]:
  """['accuracy=0.83', 'epsilon=5'] -> {'accuracy': 0.83, 'epsilon': 5.0}."""
  results = {}
  for item in items:
    key, sep, value = item.partition('=')
    try:
      if not sep or not key.strip():
        raise ValueError
      results[key.strip()] = float(value)
    except ValueError:
      raise errors.UserInputError(
          f'`paper_results`: expected key=number, got {item!r}') from None
  return results


def _choices(field) -> Optional[Mapping[str, str]]:
  """The flag's choices: the field's allowed values, or the registry it names a member of."""
  metadata = field.metadata
  return metadata.get('one_of') if metadata.get('one_of') is not None else metadata.get(
      'named_in')


def _flag_help(field) -> str:
  text = field.metadata['help']
  allowed = _choices(field)
  if isinstance(allowed, Mapping):
    text += f' One of: {choices.describe(allowed)}.'
  return text


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
  """Defines one flag per config field in `flag_values` (grouped by section); returns it."""
  for section, fields in config_lib.fields_by_section().items():
    hints = typing.get_type_hints(config_lib.all_sections()[section])
    for field in fields:
      name = sections.setting_name(field)
      base, _ = sections.base_type(hints[field.name])
      default = (field.default if field.default is not dataclasses.MISSING
                 else field.default_factory())
      common = dict(flag_values=flag_values, module_name=section)
      text = _flag_help(field)
      allowed = _choices(field)
      if allowed is not None:
        flags.DEFINE_enum(name, default, list(allowed), text, **common)
      elif base is bool:
        flags.DEFINE_bool(name, default, text, **common)
      elif base is int:
        flags.DEFINE_integer(name, default, text, **common)
      elif base is float:
        flags.DEFINE_float(name, default, text, **common)
      elif base is str:
        flags.DEFINE_string(name, default, text, **common)
      elif typing.get_origin(base) is tuple:
        flags.DEFINE_list(name, list(default), text, **common)
      else:   # paper_results: key=number pairs.
        flags.DEFINE_list(name, [f'{k}={v}' for k, v in default.items()], text, **common)
  return flag_values


def new_flag_values() -> flags.FlagValues:
  """A fresh `FlagValues` holding the config's flags (nothing parsed yet)."""
  return define_flags(flags.FlagValues())


def config_from_flags(flag_values: flags.FlagValues) -> config_lib.ExperimentConfig:
  """The config the parsed `flag_values` describe (UserInputError if it is not valid)."""
  return config_lib.ExperimentConfig.from_settings(_settings(flag_values))


def _settings(flag_values: flags.FlagValues) -> dict[str, Any]:
  """{setting: value} of the parsed flags (paths expanded, paper results parsed)."""
  values: dict[str, Any] = {}
  for section, fields in config_lib.fields_by_section().items():
    hints = typing.get_type_hints(config_lib.all_sections()[section])
    for field in fields:
      name = sections.setting_name(field)
      value = flag_values[name].value
      if typing.get_origin(hints[field.name]) is dict:   # paper_results
        value = _parse_key_values(value)
      elif field.metadata.get('path'):
        value = cli_flags.path(value)
      values[name] = value
  return values


def parse(argv: Sequence[str]) -> config_lib.ExperimentConfig:
  """Command-line arguments (without the program name; `--flagfile=` allowed) -> config.

  Raises UserInputError for an unknown flag, a value of the wrong type or choice, a stray
  positional argument, or settings the config refuses.
  """
  flag_values = new_flag_values()
  try:
    extra = flag_values(['prog', *argv])[1:]
  except flags.Error as e:
    raise errors.UserInputError(str(e)) from None
  if extra:
    raise errors.UserInputError(f'unexpected arguments {extra}')
  if not flag_values['resume'].value:
    return config_from_flags(flag_values)
  # A resume takes the run's recorded settings; the flags given on the command line override.
  if flag_values['experiment_name'].value is None:
    raise errors.UserInputError('`resume` needs `experiment_name` (the run directory to '
                                'continue)')
  given = _settings(flag_values)
  root = given['root_output_dir']
  present = {name for name in given if flag_values[name].present}
  run_path = os.path.join(root, given['experiment_name'])
  if not os.path.isdir(run_path):
    raise errors.UserInputError(
        f'`resume`: there is no run directory {run_path}; check `root_output_dir` and '
        '`experiment_name`, or start the run without `resume`')
  preflight.check_is_run(run_path)
  recorded = config_lib.recorded_settings(run_path)
  return config_lib.resumed(recorded, {k: v for k, v in given.items()
                                       if k in present or k not in recorded})


def help_text(flag_values: flags.FlagValues) -> str:
  """Every flag with its help and default, grouped by config section in declaration order."""
  blocks = []
  for section, cls in config_lib.all_sections().items():
    title = (cls.__doc__ or '').strip().splitlines()[0]
    body = flag_values.module_help(section).strip('\n')
    blocks.append(f'{section}: {title}\n' + '\n'.join(body.splitlines()[1:]))
  return cli_flags.as_flags('\n\n'.join(blocks), flag_values)


def markdown_reference() -> str:
  """docs/FLAGS.md: every setting (flag, default, help), by section, from the config's fields
  (tests/test_config.py checks the file equals this, so it never goes stale)."""
  lines = ['# Flags of `run_experiment.py` (settings of `tff_dp.ExperimentConfig`)', '',
           'Generated from the config\'s sections (`tff_dp/training/config_sections.py`, the',
           'mechanisms\' and the tasks\' own) by `python -c "import tasks; from',
           'tff_dp.training import config_flags; print(config_flags.markdown_reference(), '
           'end=\'\')" > docs/FLAGS.md`.',
           'Each flag is also a keyword of `ExperimentConfig.from_settings` and a key of a run\'s',
           'config.json; "resume" marks the settings a resumed run may change.', '']
  for section, fields in config_lib.fields_by_section().items():
    title = (config_lib.all_sections()[section].__doc__ or '').strip().splitlines()[0]
    lines += [f'## {section}: {title}', '', '| flag | default | resume | meaning |',
              '| --- | --- | --- | --- |']
    for field in fields:
      default = (field.default if field.default is not dataclasses.MISSING
                 else field.default_factory())
      text = ' '.join(_flag_help(field).split()).replace('|', '\\|')
      lines.append(f'| `--{sections.setting_name(field)}` | `{default!r}` | '
                   f'{"yes" if field.metadata.get("resumable") else ""} | {text} |')
    lines.append('')
  return '\n'.join(lines)

