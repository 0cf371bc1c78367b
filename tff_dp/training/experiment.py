"""Builds every component of a DP-FedAvg experiment from an `ExperimentConfig` and runs it.

The task is passed in (duck-typed, Contract 3 in docs/ARCHITECTURE.md), so this module does not
depend on the `tasks` package (`tff_dp.run(config)`, in `api.py`, builds it from the config).
Validation happens before the run directory is touched.
"""

import contextlib
import copy
import dataclasses
import json
import os
import random
from typing import Any, Optional

import numpy as np

import tensorflow as tf
from tensorflow.python.eager import context as tf_eager_context

from tff_dp import canaries as canaries_lib
from tff_dp import checkpoint_aggregation as ca
from tff_dp import choices
from tff_dp import ledger as ledger_lib
from tff_dp import run_format
from tff_dp import sampling
from tff_dp.aggregators import noise_feed
from tff_dp.canaries import insertion as canary_insertion
from tff_dp.canaries import scores as canary_scores
from tff_dp.run_format import release
from tff_dp.training import config as config_lib
from tff_dp.training import population as population_lib
from tff_dp.training import preflight
from tff_dp.training.builders import build_evaluation
from tff_dp.training.builders import build_privacy
from tff_dp.training.builders import build_process
from tff_dp.training.builders import client_data
from tff_dp.training.builders import components
from tff_dp.training.builders import evaluation
from tff_dp.training.config import ExperimentConfig
from tff_dp.training.rounds import aggregates_hook
from tff_dp.training.rounds import canary_run
from tff_dp.training.rounds import evaluation_hook
from tff_dp.training.rounds import loop
from tff_dp.training.rounds import noise_feed_hook
from tff_dp.training.run_state import run_dir as run_dir_lib
from tff_dp.training.run_state import stop_signal
# The resume checks live in `preflight` (no TensorFlow); their names here as before.
from tff_dp.training.preflight import RESUMABLE_CHANGES  # pylint: disable=unused-import
from tff_dp.training.preflight import resume_changes
from tff_dp.training.preflight import settings_to_record

# Settings a resumed run may change (declared with the fields: `config.setting(resumable=)`).
def run(cfg: ExperimentConfig, task, *, log=print,
        stop: Optional[stop_signal.StopSignal] = None) -> components.RunSummary:
  """Validates `cfg`, builds everything (`build_components`), and runs (or resumes) the
  experiment; returns how it ended (`summary.run_dir`: the run directory).

  `stop`: an installed `StopSignal` (a program installs it at start-up so that a signal during
  start-up is seen too); None installs one for the duration of the run. A signal before round
  1 raises `errors.RunInterrupted` before anything is written.

  Computations run in the current TFF context. `tff_dp.run(cfg)` builds the task and installs
  the context `cfg.runtime` describes (`tff_dp.training.api`); a caller of this function with
  its own task should install one too for long runs
  (`tff_dp.execution.runtime.configure_execution_context()`), since TFF's import-time context
  keeps a worker executor per client count for good (with Poisson sampling, tens of MB per
  round: issue 13).
  """
  with contextlib.ExitStack() as stack:
    stack.enter_context(_callers_random_states())
    if stop is None:
      stop = stack.enter_context(stop_signal.StopSignal(log))
    cfg = cfg.with_run_name(task.name)
    cfg.validate()
    stop.raise_if_received('during start-up')
    run_dir = stack.enter_context(contextlib.closing(run_dir_lib.RunDirectory(
        cfg.output.root_output_dir, cfg.output.experiment_name, resume=cfg.output.resume)))
    loop_config, parts = build_components(cfg, task, run_dir, log=log, stop=stop)
    log(f'run directory: {run_dir.path}  (population '
        f'{parts.sampler.sampling_event(1).population_size}, {cfg.sampling.client_sampling} '
        'sampling, '
        f'{"secret" if parts.sampler.secret else "seeded"} samples, delta {loop_config.delta:g})')
    for hook in parts.hooks:
      if isinstance(hook, canary_run.CanaryRun):
        log(hook.audit_note())
    summary = loop.run_training(loop_config, parts, stop)
    return dataclasses.replace(summary, run_dir=run_dir.path)


@contextlib.contextmanager
def _callers_random_states():
  """Gives the caller's Python, NumPy and TensorFlow random states back when the run ends: the
  run seeds them (`tf.keras.utils.set_random_seed`, for Keras' initializers) only while it lasts.

  TensorFlow has no public getter of its eager global seed, nor of the sequence its unseeded ops
  draw their op seeds from, so the context's own two fields are saved and put back (what
  `tf.random.set_seed` writes). As after any `tf.random.set_seed`, the counters of the caller's
  already-run stateful ops restart."""
  python_state, numpy_state = random.getstate(), np.random.get_state()
  tf_context = tf_eager_context.context()
  # pylint: disable=protected-access  (`_rng` exists once a seed was set)
  tf_seed, tf_op_seeds = tf_context._seed, copy.deepcopy(getattr(tf_context, '_rng', None))
  try:
    yield
  finally:
    random.setstate(python_state)
    np.random.set_state(numpy_state)
    tf_context._seed, tf_context._rng = tf_seed, tf_op_seeds
  # pylint: enable=protected-access


def build_components(config: ExperimentConfig, task, run_dir: run_dir_lib.RunDirectory, *,
                     log=print, stop: stop_signal.StopSignal
                     ) -> tuple[components.LoopConfig, components.LoopComponents]:
  """Everything the round loop of `config` on `task` needs, in `run_dir` (not yet created).

  Each part is built from its config sections (`build_privacy`, `build_process`,
  `build_evaluation`, the round hooks). Nothing is written until every input was checked: then
  the run directory is created, config.json written (with what a resume changed), the secret
  keys kept and the ledger opened (repaired on resume). `config` must be valid
  (`config.validate()`); `stop` is checked between the slow steps.
  """
  resume = config.output.resume
  recorded = run_dir.read_config() if resume else {}
  changes = resume_changes(recorded, config, task.name) if resume else {}
  if resume:
    preflight.check_rounds_left(run_dir.path, config.training.total_rounds)
  tf.keras.utils.set_random_seed(config.training.seed)

  public_ids, train_ids = population_lib.split_public(config, task.train_data.client_ids)
  evaluation_data, train_ids = build_evaluation.choose(
      config.output, config.sampling.sampling_seed, resume, task, train_ids,
      run_dir.secret_file(build_evaluation.HOLDOUT_KEY_FILE))
  # Inserted canaries are clients of the population: sampled, and counted in N and q.
  canary_key = canary_run.key(config.canaries, run_dir.secret_file(canary_run.KEY_FILE), resume)
  canary_counts = canary_run.counts(config.canaries, canary_key)
  population = canary_run.population(train_ids, canary_counts[0])
  privacy = build_privacy.build(config.sampling, config.dp, config.accounting, population,
                                run_dir.secret_file(build_privacy.SAMPLING_KEY_FILE), resume,
                                config.training.total_rounds, cohort=config.noise_cohort,
                                population_path=run_dir.secret_file(
                                    build_privacy.POPULATION_FILE),
                                recorded_population=recorded.get('population_size'),
                                ledger_key_path=run_dir.secret_file(
                                    build_privacy.LEDGER_KEY_FILE),
                                mechanism_settings=config.mechanism_settings())
  process, measurements = build_process.build(
      task, config.training, config.adadps, config.runtime, privacy.dp_factory,
      public_ids=public_ids, canaries=bool(config.canaries.num_canaries))
  canaries = _canaries(config.canaries, canary_counts, canary_key, process, task, train_ids,
                       privacy.delta, run_dir.file(canary_scores.FILE))
  stop.raise_if_received('during start-up')
  planned = build_privacy.planned_queries(privacy, process, config.accounting.max_epsilon,
                                          resume)

  # Built after the process: TFF traces model_fn inside a tf.compat.v1.Graph, which invalidates
  # Keras models created before it ("Your Layer or Model is in an invalid state").
  evaluator = evaluation.CentralizedEvaluator(
      task.keras_model_fn, task.loss_fn, task.metrics_fn,
      build_evaluation.dataset(task, config.output.max_eval_examples, config.training.seed,
                               evaluation_data.clients))
  build_privacy.check_noise_memory(privacy.dp_factory, evaluator.trainable_shapes,
                                   build_privacy.available_memory_bytes())
  hooks = _hooks(config.checkpoint_aggregation, evaluator, canaries)
  feed = noise_feed.for_factory(privacy.dp_factory)   # Correlated noise, fed from beside it.
  if feed is not None:
    hooks.insert(0, noise_feed_hook.NoiseFeedHook(
        feed, run_dir.secret_file(run_format.NOISE_SNAPSHOTS_FOLDER), log=log))
  stop.raise_if_received('during start-up')

  if resume and privacy.accountant is not None:
    ledger_lib.check_resumable(run_dir.file('ledger.jsonl'))   # Refused before any write.
  facts = release.RunFacts(
      dp=privacy.accountant is not None, noise_state_in_checkpoints=privacy.noise_state,
      eval_covered=evaluation_data.covered, seeded=config.sampling.sampling_seed is not None,
      private_release=config.output.private_release, measurements=measurements)
  stop.run_dir = run_dir.path   # A stop from here on leaves the run directory behind.
  _write_start(config, task, run_dir, facts, changes, len(population),
               privacy.delta, keys={
                   build_privacy.SAMPLING_KEY_FILE: privacy.key_to_save,
                   build_privacy.POPULATION_FILE: privacy.population_to_save,
                   build_privacy.LEDGER_KEY_FILE: privacy.ledger_key_to_save,
                   canary_run.KEY_FILE: canary_key if not resume else None,
                   build_evaluation.HOLDOUT_KEY_FILE: evaluation_data.key_to_save})
  recorder = build_privacy.recorder(
      privacy, run_dir.file('ledger.jsonl'), planned, resume, log,
      seal_path=run_dir.secret_file(build_privacy.LEDGER_SEAL_FILE))
  parts = _loop_components(config, task, run_dir, process, privacy, recorder, hooks,
                           evaluator, log)
  return _loop_config(config, privacy.delta, facts, evaluation_data.description), parts


def _loop_components(config: ExperimentConfig, task, run_dir, process, privacy, recorder,
                     hooks, evaluator, log) -> components.LoopComponents:
  """What the round loop runs with: the process, its sampler and data, the privacy
  recorder, the hooks and the evaluator."""
  max_index = evaluator.output_dim   # Labels/tokens must index the model's outputs.
  return components.LoopComponents(
      process=process, run_dir=run_dir, sampler=privacy.sampler,
      client_dataset_fn=build_process.client_dataset_fn(task), privacy=recorder,
      hooks=hooks, evaluator=evaluator, log=log,
      clip_group_labels=_clip_group_labels(privacy.dp_factory, evaluator),
      check_client_fn=lambda ds: client_data.check_client_dataset(ds, max_index),
      client_value_fn=(build_process.client_id_argument
                       if config.runtime.datasets_on_workers else None))


def _loop_config(config: ExperimentConfig, delta: float, facts: release.RunFacts,
                 eval_description: str) -> components.LoopConfig:
  """The round loop's settings: cadence, stopping, what its outputs are and how it runs."""
  return components.LoopConfig(
      total_rounds=config.training.total_rounds, rounds_per_eval=config.output.rounds_per_eval,
      rounds_per_checkpoint=config.rounds_per_checkpoint, delta=delta,
      max_epsilon=config.accounting.max_epsilon, dp=config.dp.kind, release_facts=facts,
      eval_description=eval_description,
      side_information=build_process.side_information(config.adadps),
      client_cache_size=config.runtime.client_cache_size,
      prefetch_clients=config.runtime.prefetch_clients,
      worker_restart_rounds=config.runtime.worker_restart_rounds)


def _write_start(config: ExperimentConfig, task, run_dir, facts: release.RunFacts,
                 changes: dict, population_size: int, delta: float,
                 keys: dict[str, Optional[bytes]]) -> None:
  """Creates the run directory, writes config.json (with what a resume changed) and keeps the
  new secret keys under secret/ (a resumed run read its own: the builders refuse to resume
  without them)."""
  run_dir.create(secret_checkpoints=facts.noise_state_in_checkpoints,
                 tensorboard=not facts.private_release)
  run_dir.write_config(dict(settings_to_record(config, task.name), delta_used=delta,
                            population_size=population_size), changes=changes)
  for name, key in keys.items():
    if key is not None:
      sampling.save_key(run_dir.secret_file(name), key)


def _hooks(cfg: config_lib.CheckpointAggregationConfig, evaluator, canaries) -> list:
  """The run's round hooks, in the order they act: checkpoint aggregates (which may restart
  the next round from an aggregate), evaluation (of the model and the aggregates), canaries."""
  aggregates = {}
  if cfg.ema_beta is not None:
    aggregates['ema'] = ca.EMAAggregate(cfg.ema_beta)
  if cfg.past_k:
    aggregates['past_k'] = ca.PastKAverage(cfg.past_k)
  policy = None
  if cfg.train_on_aggregate != 'none':
    policy = ca.TrainOnAggregate(cfg.train_on_aggregate, start_round=cfg.aggregate_start_round)
  recycled = aggregates_hook.AggregatesHook(aggregates, policy)
  hooks = [recycled, evaluation_hook.EvaluationHook(
      evaluator, recycled.models, uncertainty_last_k=cfg.uncertainty_last_k)]
  return hooks + ([canaries] if canaries is not None else [])


def _canaries(cfg: config_lib.CanaryConfig, counts: tuple[int, int],
              canary_key: Optional[bytes], process, task, train_ids, delta: float,
              scores_path: str) -> Optional[canary_run.CanaryRun]:
  """The run's canaries (None without): `counts` (inserted, held out) directions in the
  dimension of the model's trainable weights, from `canary_seed` or the run's key."""
  if not cfg.num_canaries:
    return None
  shapes = [w.shape for w in process.get_model_weights(process.initialize()).trainable]
  directions = canaries_lib.CanaryDirections(
      canaries_lib.dimension(shapes), *counts, seed=cfg.canary_seed, key=canary_key,
      base_fn=canary_insertion.tf_base_vector)
  dataset_fn = build_process.client_dataset_fn(task)
  return canary_run.CanaryRun(directions, lambda: dataset_fn(train_ids[0]).take(0), delta,
                              coin=cfg.canary_inclusion == 'coin', scores_path=scores_path)


def _clip_group_labels(dp_factory, evaluator) -> dict[str, str]:
  """'group_g' -> the names of its weights, for per-group (per-layer, joint) clip factories
  (those that say how they group a model: `groups_for(shapes)`)."""
  if not hasattr(dp_factory, 'groups_for'):
    return {}
  names = evaluator.trainable_weight_names
  groups = dp_factory.groups_for(evaluator.trainable_shapes)
  return {f'group_{g}': ', '.join(names[i] for i in members) for g, members in enumerate(groups)}
