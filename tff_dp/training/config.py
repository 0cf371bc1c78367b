"""The configuration of a run: nested, frozen, keyword-only sections, one field per setting.

`ExperimentConfig` holds one section per concern (task and data, sampling, training, dp,
accounting, adadps, checkpoint_aggregation, canaries, runtime, output, paper; declared in
`config_sections`, each field once, with its type, default, help and checks) and checks the
rules between sections. Everything else derives from the fields: the command line's flags
(`tff_dp.training.config_flags`, one flag per field under the field's flat name, so flag files
keep working), the checks, the run's `config.json` (`settings()`, a flat {setting name: value}
dict that holds every setting) and which settings a resume may change (`RESUMABLE_SETTINGS`).
A config is checked when it is built: a bad value raises `UserInputError` naming the setting
(in backticks, as the library names parameters).

Plug-ins add sections of their own (`tff_dp.sections.register`: the repository's
`tasks` declares its model and vocabulary settings so); their settings are flags and config.json
keys like the others, and `plugin(cls)` reads one typed. Lists of allowed values come from their
one home (`tff_dp.choices`, the mechanisms' and the tasks' registries). This module imports no
TensorFlow, so a command line is checked before TF is loaded.
"""

import dataclasses
import json
import os
import time
from typing import Any, Mapping, Optional, TypeVar

from tff_dp import choices
from tff_dp import mechanisms
from tff_dp import noise_budget
from tff_dp import sampling
from tff_dp import sections
from tff_dp.accounting import noise_cohort
from tff_dp.accounting import noise_families
from tff_dp.errors import UserInputError
from tff_dp.sections import Section
from tff_dp.sections import setting_name
from tff_dp.training import task_registry
# The library's sections: the config's parts, built and imported from here.
# pylint: disable=unused-import
from tff_dp.training.config_sections import SECTIONS
from tff_dp.training.config_sections import AccountingConfig
from tff_dp.training.config_sections import AdaDPSConfig
from tff_dp.training.config_sections import CanaryConfig
from tff_dp.training.config_sections import CheckpointAggregationConfig
from tff_dp.training.config_sections import DPConfig
from tff_dp.training.config_sections import OutputConfig
from tff_dp.training.config_sections import PaperConfig
from tff_dp.training.config_sections import RuntimeConfig
from tff_dp.training.config_sections import SamplingConfig
from tff_dp.training.config_sections import TaskConfig
from tff_dp.training.config_sections import TrainingConfig
# pylint: enable=unused-import


sections.reserve({**SECTIONS, 'plug_ins': Section})


def all_sections() -> dict[str, type[Section]]:
  """The library's sections and the registered plug-in ones (`sections.register`), in the
  order the help shows them: each plug-in's after the library section it extends."""
  return sections.ordered(SECTIONS)


_PlugIn = TypeVar('_PlugIn', bound=Section)


def _section(cls):
  return dataclasses.field(default_factory=cls)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
  """Every setting of a run, by section; checked when built (UserInputError).

  Build it from sections (`ExperimentConfig(dp=DPConfig(kind='fixed', clip=1.0,
  noise_multiplier=1.0))`) or from flat setting names (`ExperimentConfig.from_settings(dp=
  'fixed', clip=1.0, noise_multiplier=1.0)`); `replace(**settings)` returns a changed copy.
  """
  task: TaskConfig = _section(TaskConfig)
  sampling: SamplingConfig = _section(SamplingConfig)
  training: TrainingConfig = _section(TrainingConfig)
  dp: DPConfig = _section(DPConfig)
  accounting: AccountingConfig = _section(AccountingConfig)
  adadps: AdaDPSConfig = _section(AdaDPSConfig)
  checkpoint_aggregation: CheckpointAggregationConfig = _section(CheckpointAggregationConfig)
  canaries: CanaryConfig = _section(CanaryConfig)
  runtime: RuntimeConfig = _section(RuntimeConfig)
  output: OutputConfig = _section(OutputConfig)
  paper: PaperConfig = _section(PaperConfig)
  # The registered plug-ins' sections by name (`sections.register`; the defaults of those not
  # given); read one typed with `plugin(cls)`.
  plug_ins: Mapping[str, Section] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    for name, cls in SECTIONS.items():
      if not isinstance(getattr(self, name), cls):
        raise UserInputError(
            f'`{name}` must be a {cls.__name__}, got {getattr(self, name)!r} (flat settings by '
            'name: `ExperimentConfig.from_settings(...)`)')
    registered = sections.plug_ins()
    for name, section in self.plug_ins.items():
      if name not in registered or not isinstance(section, registered[name]):
        raise UserInputError(f'`plug_ins`: {name!r} is not a registered section, or '
                             f'{section!r} is not its class')
    object.__setattr__(self, 'plug_ins', {name: self.plug_ins.get(name) or cls()
                                          for name, cls in registered.items()})
    self.validate()

  def plugin(self, cls: type[_PlugIn]) -> _PlugIn:
    """This config's section of the plug-in class `cls` (its defaults if `cls` registered after
    this config was built); KeyError if `cls` is not registered."""
    if sections.plug_ins().get(cls.SECTION) is not cls:
      raise KeyError(f'{cls.__name__} is not a registered config section')
    return self.plug_ins.get(cls.SECTION) or cls()

  def task_options(self) -> dict[str, Any]:
    """The registered task's own builder options, from the settings its entry names
    (`task_registry.RegisteredTask.options`); UserInputError if the task is not registered."""
    settings = self.settings()
    return {option: settings[name]
            for option, name in task_registry.get(self.task.name).options.items()}

  def validate(self) -> None:
    """Raises UserInputError for settings that contradict each other across sections (each
    section checked its own when built)."""
    self.dp.check_complete()
    dp = self.dp.kind
    if dp != 'none' and self.training.weighting != 'uniform':
      raise UserInputError(
          f'`dp={dp}` requires uniform client weighting (`weighting=uniform`): a client '
          'weighted by its example count could exceed the clip-based sensitivity')
    mechanism = mechanisms.find(dp)
    if mechanism is not None and mechanism.adapts_clip and self.dp.noise_multiplier:
      noise_budget.update_noise_multiplier(
          self.dp.noise_multiplier, noise_budget.resolve_clipped_count_stddev(
              self.dp.clipped_count_stddev,
              self.dp.noise_cohort_size or self.sampling.clients_per_round,
              self.dp.noise_multiplier))
    if mechanism is not None:
      self._check_own_settings(mechanism)
    self._check_noise_cohort()
    if self.accounting.max_epsilon is not None and dp == 'none':
      raise UserInputError('`max_epsilon` needs DP (`dp` != none)')
    grouped = sampling.get(self.sampling.client_sampling)
    if grouped.grouped:
      chosen = f'`client_sampling={grouped.name}`'
      if mechanism is None or not mechanism.amplified_by_groups:
        amplified = [n for n, m in mechanisms.MECHANISMS.items() if m.amplified_by_groups]
        instead = (f', or `client_sampling={choices.one_of(mechanism.samplers)}`'
                   if mechanism is not None else '')
        raise UserInputError(f'{chosen} amplifies {choices.one_of(amplified)} only (`dp={dp}` '
                             f'has no analysis of it); use `dp={amplified[0]}`{instead}')
      own = self.mechanism_settings()
      if own.get('bands') is None:
        raise UserInputError(f'{chosen} needs `bands`: the clients are partitioned into that '
                             'many groups')
      ungrouped = [s for s in mechanism.samplers if not sampling.get(s).grouped]
      for name in ('min_separation', 'max_participations'):
        if own.get(name) is not None:
          raise UserInputError(f'`{name}` is a setting of `client_sampling='
                               f'{choices.one_of(ungrouped)}`; {grouped.title} sampling '
                               'visits each of `bands` groups every `bands` rounds')
    if mechanism is not None:   # The mechanism's own samplers too, a registered one's as well.
      mechanisms.claim(dp, self.sampling.client_sampling,
                       self.sampling.sampling_probability is not None)
    if self.canaries.num_canaries:
      if dp == 'none':
        raise UserInputError('`num_canaries` needs DP (`dp` != none): a canary\'s update is '
                             'only bounded by the clip')
      if self.runtime.datasets_on_workers:
        raise UserInputError('`num_canaries` does not work with `datasets_on_workers` (a '
                             'canary has no client id the workers could build data for)')
    if (mechanism is not None and mechanism.noise.carries_state
        and self.output.rerun_released_rounds):
      raise UserInputError(
          f'`rerun_released_rounds` cannot apply to `dp={dp}`: a re-executed round reuses its '
          'noise state, which the accounting does not cover; restore checkpoints/ or start a '
          'new run')
    if (mechanism is not None and mechanism.noise.carries_state
        and self.output.rounds_per_checkpoint not in (None, 1)):
      raise UserInputError(
          f'`dp={dp}` needs `rounds_per_checkpoint=1`: a resume must not re-execute a round '
          'whose output was released (its noise state is reused, which the accounting does '
          'not cover)')

  def _check_own_settings(self, mechanism: mechanisms.Mechanism) -> None:
    """Refuses a mechanism's own setting that is unset unless given (`bands`, ...) when given
    with a mechanism that does not take it (it would be ignored)."""
    for section in self.plug_ins.values():
      if type(section) in mechanism.settings:
        continue
      for field in dataclasses.fields(section):
        if field.default is None and getattr(section, field.name) is not None:
          having = [n for n, m in mechanisms.MECHANISMS.items() if type(section) in m.settings]
          if having:
            raise UserInputError(f'`{setting_name(field)}` is a setting of '
                                 f'`dp={"|".join(having)}`, not of `dp={self.dp.kind}`')

  def mechanism_settings(self) -> dict[str, Any]:
    """The chosen mechanism's own settings by flat name (its `Mechanism.settings` sections;
    {} without DP)."""
    mechanism = mechanisms.find(self.dp.kind)
    if mechanism is None:
      return {}
    return {setting_name(f): getattr(self.plugin(cls), f.name)
            for cls in mechanism.settings for f in dataclasses.fields(cls)}

  def _check_noise_cohort(self) -> None:
    cohort, population = self.dp.noise_cohort_size, self.dp.noise_population
    if (cohort is None) != (population is None):
      raise UserInputError('`noise_cohort_size` and `noise_population` go together: the '
                           'projection samples the cohort from that population')
    if cohort is None:
      return
    if self.dp.kind == 'none':
      raise UserInputError('`noise_cohort_size` needs DP (`dp` != none)')
    if self.output.private_release:
      raise UserInputError('`private_release` refuses `noise_cohort_size`: a simulation\'s '
                           'projected epsilon protects nobody it trained on; release a run '
                           'without a noise cohort')
    _ = self.noise_cohort   # Building it checks its sizes and the production sampling rate.

  @property
  def noise_cohort(self) -> Optional[noise_cohort.NoiseCohort]:
    """The noise-cohort simulation of this run, or None."""
    if self.dp.noise_cohort_size is None:
      return None
    cyclic = sampling.get(self.sampling.client_sampling).grouped
    return noise_cohort.NoiseCohort(self.dp.noise_cohort_size, self.dp.noise_population,
                                    self.sampling.clients_per_round,
                                    groups=self.mechanism_settings().get('bands') if cyclic
                                    else None)

  @classmethod
  def from_settings(cls, settings: Optional[Mapping[str, Any]] = None,
                    **more: Any) -> 'ExperimentConfig':
    """The config with these flat settings (setting names as the flags and config.json name
    them) and defaults elsewhere; UserInputError for an unknown name."""
    values = dict(settings or {}, **more)
    fields = _fields()
    unknown = sorted(set(values) - set(fields))
    if unknown:
      raise UserInputError(f'unknown setting(s) {", ".join(f"`{n}`" for n in unknown)}')
    built = {}
    for section_name, section_cls in all_sections().items():
      built[section_name] = section_cls(**{
          field: values[name] for name, (section, field) in fields.items()
          if section == section_name and name in values})
    return cls(**{name: built.pop(name) for name in SECTIONS}, plug_ins=built)

  def settings(self) -> dict[str, Any]:
    """Every setting by its flat name (what config.json records)."""
    return {name: getattr(self._section(section), field)
            for name, (section, field) in _fields().items()}

  def _section(self, name: str) -> Section:
    if name in SECTIONS:
      return getattr(self, name)
    return self.plug_ins.get(name) or sections.plug_ins()[name]()

  def replace(self, **settings: Any) -> 'ExperimentConfig':
    """A copy with these flat settings changed (checked as a whole)."""
    return self.from_settings(self.settings(), **settings)

  @property
  def rounds_per_checkpoint(self) -> int:
    """`rounds_per_checkpoint`, or its default for the mechanism when unset."""
    if self.output.rounds_per_checkpoint is not None:
      return self.output.rounds_per_checkpoint
    mechanism = mechanisms.find(self.dp.kind)
    return (noise_families.INDEPENDENT if mechanism is None
            else mechanism.noise).rounds_per_checkpoint

  def with_run_name(self, task_name: Optional[str] = None) -> 'ExperimentConfig':
    """The config with `experiment_name` set: TASK-DP-TIMESTAMP when it is unset (TASK:
    `task_name`, default the registered task's name)."""
    if self.output.experiment_name is not None:
      return self
    return self.replace(experiment_name=(f'{task_name or self.task.name}-{self.dp.kind}-'
                                         f'{time.strftime("%Y%m%d-%H%M%S")}'))


def recorded_settings(run_path: str) -> dict[str, Any]:
  """What RUN_PATH/config.json recorded ({} if the run has none yet): the one reader of the
  file (`run_dir.RunDirectory.write_config` writes it)."""
  path = os.path.join(run_path, 'config.json')
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    return {}
  except (OSError, ValueError) as e:
    raise UserInputError(f'cannot read {path}: {e}') from e


def resumed(recorded: Mapping[str, Any], given: Mapping[str, Any]) -> 'ExperimentConfig':
  """The config of a resumed run: the `recorded` settings (config.json), with `given` ones on
  top (a resume may change only `RESUMABLE_SETTINGS`; `tff_dp.training.experiment` refuses the
  rest), so that resuming needs only where the run is."""
  fields = _fields()
  settings = {k: v for k, v in recorded.items() if k in fields and k not in PER_INVOCATION}
  settings.update(given)
  return ExperimentConfig.from_settings(settings, resume=True)


def _fields() -> dict[str, tuple[str, str]]:
  """Flat setting name -> (section, field name), in section order (plug-ins included)."""
  return {setting_name(f): (section, f.name)
          for section, cls in all_sections().items() for f in dataclasses.fields(cls)}


# Settings that hold for the invocation they are given to: a resume never takes them from the
# record (a later resume re-executes no released round unless asked again).
PER_INVOCATION = ('resume', 'rerun_released_rounds')

# Settings a resumed run may change (cadence, stopping, reporting, execution and the paper
# notes; never a plug-in's: `sections.register`); any other change would make the resumed run
# a different mechanism, model or data than the one the ledger and checkpoints describe, and
# is refused. loop_implementation and
# datasets_on_workers are execution: how and where TFF runs the same client SGD steps.
RESUMABLE_SETTINGS = tuple(setting_name(f) for cls in SECTIONS.values()
                           for f in dataclasses.fields(cls) if f.metadata.get('resumable'))


def fields_by_section() -> dict[str, list[dataclasses.Field]]:
  """{section name: its fields}, in declaration order, plug-ins included (flags and help)."""
  return {name: list(dataclasses.fields(cls)) for name, cls in all_sections().items()}
