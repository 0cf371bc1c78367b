"""The run configuration as data: flags -> config, config.json <-> config, checks, registries.

All of it without TensorFlow (the command line checks its flags before TF is loaded).
"""

import json
import os
import subprocess
import sys

import pytest

import tasks
from run_helpers import REPO
from run_helpers import script_env
from tff_dp import choices
from tff_dp import mechanisms
from tff_dp import sampling
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib
from tff_dp.training import config_flags
from tff_dp.training import preflight
from tff_dp.training.config import ExperimentConfig


def test_config_and_flag_modules_import_no_tensorflow():
  code = ('import sys; import tff_dp, tff_dp.choices, tff_dp.training.config, '
          'tff_dp.training.config_flags, tasks, tasks.registry; '
          'assert "tensorflow" not in sys.modules, [m for m in sys.modules if "tensorflow" in m]')
  proc = subprocess.run([sys.executable, '-c', code], env=script_env(), cwd=REPO,
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr


def test_flags_give_the_config_built_from_sections():
  cfg = config_flags.parse([
      '--task=stackoverflow_tag', '--so_vocab_size=300', '--client_batch_size=8',
      '--dp=fixed', '--clip=2', '--noise_multiplier=0.5', '--accounting=rdp',
      '--clients_per_round=7', '--client_sampling=fixed_size', '--noprefetch_clients',
      '--paper_results=accuracy=0.5,epsilon=3', '--experiment_name=x'])
  assert cfg == ExperimentConfig(
      task=config_lib.TaskConfig(name='stackoverflow_tag', client_batch_size=8),
      plug_ins={'task_options': tasks.TaskSettings(so_vocab_size=300)},
      dp=config_lib.DPConfig(kind='fixed', clip=2.0, noise_multiplier=0.5),
      accounting=config_lib.AccountingConfig(methods=('rdp',)),
      sampling=config_lib.SamplingConfig(clients_per_round=7, client_sampling='fixed_size'),
      runtime=config_lib.RuntimeConfig(prefetch_clients=False),
      paper=config_lib.PaperConfig(paper_results={'accuracy': 0.5, 'epsilon': 3.0}),
      output=config_lib.OutputConfig(experiment_name='x'))
  assert cfg.plugin(tasks.TaskSettings).so_vocab_size == 300   # Typed, the tasks' own section.
  assert cfg.task_options() == {'word_vocab_size': 300, 'tag_vocab_size': 500}
  assert cfg.replace(task='stackoverflow_word').task_options() == {
      'vocab_size': 300, 'sequence_length': 20, 'embedding_size': 96, 'latent_size': 670}
  assert cfg.replace(task='emnist', emnist_only_digits=True).task_options() == {
      'only_digits': True}


def test_settings_hold_every_field_and_round_trip_through_json():
  cfg = ExperimentConfig.from_settings(
      task='stackoverflow_word', data_dir='/data', dp='joint', clip=0.5, noise_multiplier=1.0,
      workers='a:1,b:2', client_batch_size=16, client_epochs_per_round=2, so_vocab_size=100,
      accounting=('pld', 'rdp'), paper_results={'accuracy': 0.3}, experiment_name='run')
  recorded = json.loads(json.dumps(cfg.settings()))   # What config.json holds.
  # The settings config.json used to miss are there, under their flag names.
  assert {k: recorded[k] for k in ('client_batch_size', 'client_epochs_per_round', 'data_dir',
                                   'so_vocab_size', 'so_tag_vocab_size', 'workers')} == {
      'client_batch_size': 16, 'client_epochs_per_round': 2, 'data_dir': '/data',
      'so_vocab_size': 100, 'so_tag_vocab_size': 500, 'workers': 'a:1,b:2'}
  assert set(recorded) == set(config_flags.new_flag_values())   # Every flag is recorded.
  assert ExperimentConfig.from_settings(recorded) == cfg
  assert cfg.replace(clip=2.0).dp.clip == 2.0 and cfg.dp.clip == 0.5   # Frozen: a copy.
  with pytest.raises(Exception):
    cfg.dp.clip = 3.0   # pylint: disable=assigning-non-slot


def test_the_settings_a_resume_may_change_are_the_same_as_before():
  """Cadence, stopping, reporting, execution and paper notes (the list before issue 14, with
  the former `runtime_settings` spelled out), and where the run directory is (issue 25: its
  location is not a setting of the run), and whether native log lines are shown (issue 37)."""
  assert sorted(config_lib.RESUMABLE_SETTINGS) == sorted([
      'root_output_dir', 'experiment_name',
      'total_rounds', 'max_epsilon', 'rounds_per_eval', 'rounds_per_checkpoint',
      'max_eval_examples', 'pld_every', 'accounting', 'client_cache_size', 'prefetch_clients',
      'worker_restart_rounds', 'loop_implementation', 'datasets_on_workers', 'workers',
      'max_concurrent_computation_calls', 'client_slices', 'worker_unavailable_timeout',
      'worker_rpc_timeout', 'native_logs', 'paper_table', 'paper_arm', 'paper_results',
      'paper_note'])


@pytest.mark.parametrize('settings,message', [
    (dict(clients_per_round=0), '`clients_per_round` must be a positive integer, got 0'),
    (dict(clip=float('nan')), '`clip` must be a finite number, got nan'),
    (dict(clip=-1.0), '`clip` must be positive, got -1.0'),
    (dict(dp='fixed', clip=1.0), '`dp=fixed` needs `noise_multiplier` >= 0'),
    (dict(dp='none', noise_multiplier=1.0), '`noise_multiplier` needs DP'),
    (dict(dp='gaussian'), '`dp` must be one of none, fixed, adaptive, per_layer_adaptive, '
                          "joint, ftrl, ftrl_adaptive, blt or bandmf, got 'gaussian'"),
    (dict(dp='none', accounting=('rdp', 'rdp')), '`accounting` must be a non-empty list'),
    (dict(dp='none', max_epsilon=1.0), '`max_epsilon` needs DP'),
    (dict(dp='none', client_sampling='fixed_size', sampling_probability=0.1),
     '`sampling_probability` is the rate of poisson or cyclic_poisson sampling'),
    (dict(dp='none', sampling_probability=0.0), '`sampling_probability` must be in (0, 1]'),
    (dict(dp='none', eval_holdout_clients=10), 'give `eval_data=holdout` or drop it'),
    (dict(dp='none', root_output_dir=''), '`root_output_dir` must name a directory'),
    (dict(dp='fixed', clip=1.0, noise_multiplier=1.0, weighting='num_examples'),
     'requires uniform client weighting'),
    (dict(dp='none', train_on_aggregate='ema'), '`train_on_aggregate=ema` needs `ema_beta`'),
    (dict(dp='none', precondition='client', side_info='words'), '`side_info` must be one of'),
    (dict(dp='none', client_slices=2, workers='a:1'), '`client_slices` is for the local'),
    (dict(dp='none', total_rounds=True), '`total_rounds` must be an integer, got True'),
    (dict(dp='none', experiment_name='a/b'), '`experiment_name` must be a plain non-empty'),
    (dict(dp='none', paper_results={'accuracy': 'high'}), '`paper_results` must map'),
    (dict(dp='none', clip_norm=1.0), 'unknown setting(s) `clip_norm`'),
    (dict(dp='none', rerun_released_rounds=True), '`rerun_released_rounds` applies to a '
                                                  '`resume` only'),
    (dict(dp='ftrl', clip=1.0, noise_multiplier=1.0, client_sampling='shuffled', resume=True,
          rerun_released_rounds=True),
     '`rerun_released_rounds` cannot apply to `dp=ftrl`'),
    # A setting that would be silently ignored (the new-user re-trial of issue 51).
    (dict(dp='none', data_dir='/data', embedded_data_dir='/elsewhere'),
     'with `data_dir` it is not used'),
    (dict(dp='none', canary_seed=3), 'without `num_canaries` there is none'),
])
def test_bad_settings_are_refused_naming_the_setting(settings, message):
  with pytest.raises(UserInputError) as raised:
    ExperimentConfig.from_settings(settings)
  assert message in str(raised.value)


def test_a_task_is_checked_against_the_registry_where_the_run_builds_it(tmp_path):
  """The `task` setting names a registered task (the repository's, registered by importing
  `tasks`); a config may be built first (or for a task object of the user's), so the name is
  refused where the run builds the task: in the checks before anything is written, with the
  registered tasks listed."""
  cfg = ExperimentConfig.from_settings(task='mnist', dp='none', root_output_dir=str(tmp_path))
  with pytest.raises(UserInputError, match="unknown `task` 'mnist': the registered tasks are "
                     'emnist, stackoverflow_word or stackoverflow_tag'):
    preflight.check(cfg)
  with pytest.raises(UserInputError, match="unknown `task` 'mnist'"):
    cfg.task_options()
  assert os.listdir(tmp_path) == []


def test_the_library_does_not_import_the_tasks():
  """Issue 38.5: the library does not import the repository's `tasks` (a config built without
  it has no task settings and knows no task; tests/test_architecture.py checks every module's
  imports, function-level ones too, against the layers, where `tasks` sits above the library),
  and `tasks` registers its tasks and typed settings when imported."""
  code = ('import sys\n'
          'from tff_dp.training import api, config, config_flags, preflight, task_registry\n'
          'assert "tasks" not in sys.modules, "tasks imported"\n'
          'cfg = config.ExperimentConfig.from_settings(dp="none")\n'
          'assert "task_options" not in cfg.plug_ins and "so_vocab_size" not in cfg.settings()\n'
          'assert not task_registry.is_registered("emnist")\n'
          'import tasks\n'
          'assert task_registry.is_registered("emnist")\n'
          'cfg = config.ExperimentConfig.from_settings(dp="none", so_vocab_size=7)\n'
          'print(cfg.plugin(tasks.TaskSettings).so_vocab_size)\n')
  proc = subprocess.run([sys.executable, '-c', code], env=script_env(), cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ['7']


def test_side_info_is_free_without_preconditioning_and_any_file_with_it():
  assert ExperimentConfig.from_settings(dp='none', side_info='anything').adadps.side_info == (
      'anything')
  assert ExperimentConfig.from_settings(dp='none', precondition='server',
                                        side_info='file:/s.npy').adadps.precondition == 'server'


def test_flag_choices_come_from_the_registries():
  flag_values = config_flags.new_flag_values()
  for flag, registry in [('dp', mechanisms.DP_KINDS), ('client_sampling', sampling.KINDS),
                         ('client_optimizer', choices.OPTIMIZERS),
                         ('noise_allocation', choices.NOISE_ALLOCATIONS),
                         ('precondition', choices.PRECONDITION_SIDES),
                         ('preconditioner', choices.PRECONDITIONERS),
                         ('train_on_aggregate', choices.TRAIN_ON_AGGREGATE),
                         ('loop_implementation', choices.LOOP_IMPLEMENTATIONS),
                         ('clip_update_rule', choices.CLIP_UPDATE_RULES),
                         ('weighting', choices.WEIGHTINGS)]:
    assert flag_values[flag].parser.enum_values == list(registry), flag
  import tasks  # pylint: disable=g-import-not-at-top
  assert flag_values['task'].parser.enum_values == list(tasks.TASKS)


def test_an_implementation_table_must_cover_its_registry():
  choices.check_implemented({'a': '', 'b': ''}, {'b': 1, 'a': 2}, 'toy')
  with pytest.raises(AssertionError, match=r"toy: implemented \['a'\], listed .*\['a', 'b'\]"):
    choices.check_implemented({'a': '', 'b': ''}, {'a': 1}, 'toy')


def test_the_run_name_defaults_to_task_dp_and_time():
  cfg = ExperimentConfig.from_settings(task='emnist', dp='none')
  assert cfg.output.experiment_name is None
  name = cfg.with_run_name().output.experiment_name
  assert name.startswith('emnist-none-') and len(name) == len('emnist-none-20261123-180000')


def test_the_flag_reference_is_current():
  """docs/FLAGS.md is generated from the config's fields (issue 26): regenerate it with the
  command at its top when a setting changes."""
  from tff_dp.training import config_flags   # pylint: disable=g-import-not-at-top
  from run_helpers import REPO   # pylint: disable=g-import-not-at-top
  with open(os.path.join(REPO, 'docs', 'FLAGS.md')) as f:
    assert f.read() == config_flags.markdown_reference()


def test_run_names_a_config_of_the_wrong_type():
  """Issue 51, item 5: `tff_dp.run('not a config')` raised AttributeError."""
  import tff_dp   # pylint: disable=g-import-not-at-top
  with pytest.raises(UserInputError, match='`run` takes an ExperimentConfig, got str'):
    tff_dp.run('not a config')


def test_a_section_of_the_wrong_type_is_named_before_the_defaults_are_judged():
  """Issue 51, item 5: `ExperimentConfig(task='emnist')` said "dp=adaptive needs clip", the
  default DP section's own incompleteness hiding the wrong type; a config still needs its clip."""
  with pytest.raises(UserInputError, match=r"^`task` must be a TaskConfig, got 'emnist'"):
    ExperimentConfig(task='emnist')
  with pytest.raises(UserInputError, match='`dp=adaptive` needs `clip`'):
    ExperimentConfig(task=config_lib.TaskConfig(name='emnist'))
  assert config_lib.DPConfig().kind == 'adaptive'   # A section the user completes.
  done = ExperimentConfig(dp=config_lib.DPConfig(clip=1.0, noise_multiplier=0.5))
  assert done.dp.clip == 1.0


def test_rerunning_released_rounds_holds_for_the_resume_it_is_given_to():
  """Issue 51, item 1: config.json of a resume that re-executed rounds records the choice; the
  next resume does not take it from there."""
  recorded = json.loads(json.dumps(ExperimentConfig.from_settings(
      dp='fixed', clip=1.0, noise_multiplier=1.0, experiment_name='x', resume=True,
      rerun_released_rounds=True).settings()))   # As config.json holds it.
  assert recorded['rerun_released_rounds'] is True
  assert config_lib.resumed(recorded, {}).output.rerun_released_rounds is False
  assert config_lib.resumed(recorded, {'rerun_released_rounds': True}).output.rerun_released_rounds
  assert preflight.resume_changes(recorded, config_lib.resumed(recorded, {})) == {}
