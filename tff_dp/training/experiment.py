"""Builds every component of a DP-FedAvg experiment from an `ExperimentConfig` and runs it.

The task is passed in (duck-typed, Contract 3 in docs/ARCHITECTURE.md), so this module does not
depend on the `tasks` package (`tff_dp.run(config)`, in `api.py`, builds it from the config).
Validation happens before the run directory is touched.
"""

import contextlib
import dataclasses
import json
import os
import types
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import accounting
from tff_dp import aggregators
from tff_dp import canaries as canaries_lib
from tff_dp import checkpoint_aggregation as ca
from tff_dp import choices
from tff_dp import ledger as ledger_lib
from tff_dp import sampling
from tff_dp.aggregators import non_finite
from tff_dp.aggregators import privacy_queries as privacy_queries_lib
from tff_dp.canaries import insertion as canary_insertion
from tff_dp.errors import UserInputError
from tff_dp.training import adadps_setup
from tff_dp.training import canary_run
from tff_dp.training import client_data
from tff_dp.training import components
from tff_dp.training import config as config_lib
from tff_dp.training import evaluation
from tff_dp.training import fed_avg
from tff_dp.training import loop
from tff_dp.training import optimizers
from tff_dp.training import release
from tff_dp.training import run_dir as run_dir_lib
from tff_dp.training import stop_signal
from tff_dp.training.config import ExperimentConfig

# `loop_implementation` -> TFF's client training loop. dataset_iterator: a Python `for` over
# the dataset inside the client's tf.function; dataset_reduce (TFF's default): one
# DatasetReduce op. They run the same steps in the same order (same model, to float rounding).
LOOP_IMPLEMENTATIONS = {
    'dataset_iterator': tff.learning.LoopImplementation.DATASET_ITERATOR,
    'dataset_reduce': tff.learning.LoopImplementation.DATASET_REDUCE,
}
choices.check_implemented(choices.LOOP_IMPLEMENTATIONS, LOOP_IMPLEMENTATIONS,
                          'tff_dp.training.experiment loop implementations')

# Settings a resumed run may change (declared with the fields: `config.setting(resumable=)`).
RESUMABLE_CHANGES = config_lib.RESUMABLE_SETTINGS
# Secret keys kept in the run directory's secret/ folder for resume (tff_dp.sampling): the
# shuffled sampler's and the one choosing held-out evaluation clients.
SAMPLING_KEY_FILE = 'sampling_key'
HOLDOUT_KEY_FILE = 'holdout_key'


def resume_changes(recorded: dict[str, Any], cfg: ExperimentConfig) -> dict[str, tuple]:
  """{setting: (recorded value, new value)} for every setting that differs on resume.

  Raises UserInputError naming each differing setting outside `RESUMABLE_CHANGES`. Settings a
  run directory written by an older version did not record are not compared.
  """
  new = json.loads(json.dumps(cfg.settings()))   # JSON types, as recorded.
  changes = {name: (recorded[name], value) for name, value in new.items()
             if name in recorded and name != 'resume' and recorded[name] != value}
  refused = {k: v for k, v in changes.items() if k not in RESUMABLE_CHANGES}
  if refused:
    listed = '; '.join(f'`{k}` was {old!r}, now {new_value!r}'
                       for k, (old, new_value) in refused.items())
    raise UserInputError(
        f'cannot resume {os.path.join(cfg.output.root_output_dir, cfg.output.experiment_name)} '
        f'with different settings: {listed}. A resumed run must be the same mechanism, model '
        f'and data; only {", ".join(f"`{k}`" for k in RESUMABLE_CHANGES)} may change (nothing '
        'was changed)')
  return changes


def build_aggregator(dp: config_lib.DPConfig, clients_per_round: int,
                     rounds_per_epoch: Optional[int] = None):
  """The model-update aggregation factory for `dp.kind` (None = TFF's default mean).

  `rounds_per_epoch`: the tree factories restart after every epoch of the shuffled sampler."""
  if dp.kind == 'none':
    return None
  tree_options = {}
  if dp.kind in aggregators.TREE_KINDS:
    tree_options['rounds_per_epoch'] = rounds_per_epoch
  if dp.kind == 'ftrl_adaptive':
    tree_options.update(restart_warmup=dp.restart_warmup,
                        restart_frequency=dp.restart_frequency)
  return aggregators.build_dp_aggregator(
      dp.kind, noise_multiplier=float(dp.noise_multiplier),
      clients_per_round=float(clients_per_round), clip=float(dp.clip),
      target_unclipped_quantile=dp.target_unclipped_quantile,
      clip_learning_rate=dp.clip_learning_rate, update_rule=dp.clip_update_rule,
      clipped_count_stddev=dp.clipped_count_stddev, noise_allocation=dp.noise_allocation,
      **tree_options)


def _sampler(cfg: config_lib.SamplingConfig, client_ids, key_path: str, resume: bool):
  """The configured sampler; the shuffled one's secret key is read from `key_path` on resume
  (a new key mid-epoch would let clients participate twice in the epoch)."""
  population = len(client_ids)
  if population == 0:
    raise UserInputError('the training data has no clients')
  if cfg.clients_per_round > population:
    raise UserInputError(f'`clients_per_round={cfg.clients_per_round}` exceeds the '
                         f'{population} training clients')
  key = None
  if cfg.client_sampling == 'shuffled' and cfg.sampling_seed is None:
    key = sampling.load_key(key_path)
    if key is None and resume:
      raise UserInputError(f'`resume`: {key_path} is missing; without the shuffling key the '
                           'epochs cannot be continued (clients could participate twice)')
  return sampling.build_sampler(cfg.client_sampling, client_ids, cfg.clients_per_round,
                                seed=cfg.sampling_seed, key=key)


def _eval_dataset(task, max_examples: int, seed: int, clients: Optional[list] = None):
  """The preprocessed evaluation data: the test split's (all clients), or the test-split data
  of `clients` (held-out clients)."""
  if clients is None:
    # TFF shuffles the client order with an unseeded RNG unless given a seed: with
    # --max_eval_examples the evaluated subset would differ between runs (and across a resume).
    raw = task.test_data.create_tf_dataset_from_all_clients(seed=seed)
  else:   # As TFF's create_tf_dataset_from_all_clients builds it, for these clients only.
    raw = tf.data.Dataset.from_tensor_slices(clients).flat_map(
        task.test_data.serializable_dataset_fn)
  if max_examples:
    raw = raw.take(max_examples)
  return task.preprocess_eval(raw)


@dataclasses.dataclass
class _Evaluation:
  """The evaluation data's clients (None: the whole test split), whether its metrics are
  covered, how the statement describes it, and the holdout key to keep (new secret runs)."""
  clients: Optional[list]
  covered: bool
  description: str
  key_to_save: Optional[bytes] = None


def _evaluation(cfg, task, train_ids: list, key_path: str) -> tuple[_Evaluation, list]:
  """(the evaluation, the training ids left for the population)."""
  if cfg.eval_data == 'public_test':
    return _Evaluation(None, True, 'public_test'), train_ids
  if cfg.eval_data == 'test':
    shared = not set(task.test_data.client_ids).isdisjoint(train_ids)
    return _Evaluation(None, not shared, 'test_shared' if shared else 'test_disjoint'), train_ids
  # Held out among the training clients that have test data (TFF's test splits hold later
  # data of training users): a client-level split of the test data.
  test_ids = set(task.test_data.client_ids)
  candidates = [c for c in train_ids if c in test_ids]
  if not candidates:
    raise UserInputError('`eval_data=holdout`: no client of the test split is in the training '
                         'population, so `eval_data=test` is already covered; use it')
  count = cfg.eval_holdout_clients or max(1, min(1000, len(candidates) // 10))
  key, key_to_save = None, None
  if cfg.sampling_seed is None:
    key = sampling.load_key(key_path, what='holdout key')
    if key is None:
      if cfg.resume:
        raise UserInputError(f'`resume`: {key_path} is missing; without the holdout key the '
                             'held-out evaluation clients cannot be chosen again')
      key = key_to_save = sampling.holdout_key(None)
  else:
    key = sampling.holdout_key(cfg.sampling_seed)
  held_out = set(sampling.hold_out(candidates, count, key)[0])
  rest = [c for c in train_ids if c not in held_out]
  return _Evaluation(sorted(held_out), True, 'holdout', key_to_save), rest


def first_round_queries(process) -> tuple[ledger_lib.GaussianSumQuery, ...]:
  """The Gaussian sum queries round 1 will execute, read from a round run on no client.

  The learning process runs one round on zero clients from its initial state (no client data
  is touched, so this costs no privacy; the result is discarded): the aggregator reports the
  (clip, noise stddev) tuples of its pre-round state exactly as it will in round 1.
  """
  output = process.next(process.initialize(), [])
  return tuple(privacy_queries_lib.find_privacy_queries(output.metrics['aggregator']))


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
  (`tff_dp.runtime.configure_execution_context()`), since TFF's import-time context keeps a
  worker executor per client count for good (with Poisson sampling, tens of MB per round:
  issue 13).
  """
  with contextlib.ExitStack() as stack:
    if stop is None:
      stop = stack.enter_context(stop_signal.StopSignal(log))
    cfg = cfg.with_run_name()
    cfg.validate()
    stop.raise_if_received('during start-up')
    run_dir = stack.enter_context(contextlib.closing(run_dir_lib.RunDirectory(
        cfg.output.root_output_dir, cfg.output.experiment_name, resume=cfg.output.resume)))
    loop_config, parts = build_components(cfg, task, run_dir, log=log, stop=stop)
    log(f'run directory: {run_dir.path}  (population '
        f'{parts.sampler.sampling_event(1).population_size}, {cfg.sampling.client_sampling} '
        'sampling, '
        f'{"secret" if parts.sampler.secret else "seeded"} samples, delta {loop_config.delta:g})')
    summary = loop.run_training(loop_config, parts, stop)
    return dataclasses.replace(summary, run_dir=run_dir.path)


def build_components(config: ExperimentConfig, task, run_dir: run_dir_lib.RunDirectory, *,
                     log=print, stop: stop_signal.StopSignal
                     ) -> tuple[components.LoopConfig, components.LoopComponents]:
  """Everything the round loop of `config` on `task` needs, in `run_dir` (not yet created).

  Nothing is written until every input was checked: then the run directory is created and
  config.json written (with what a resume changed), and the ledger opened (repaired on resume).
  `config` must be valid (`config.validate()`); `stop` is checked between the slow steps.
  """
  # The settings by their flat names (`cfg.clip`, `cfg.dp`), as config.json records them.
  cfg = types.SimpleNamespace(**config.settings())
  changes = resume_changes(run_dir.read_config(), config) if cfg.resume else {}
  tf.keras.utils.set_random_seed(cfg.seed)

  train_ids = list(task.train_data.client_ids)
  if cfg.max_train_clients is not None:
    if cfg.max_train_clients > len(train_ids):
      raise UserInputError(f'`max_train_clients={cfg.max_train_clients}` exceeds the '
                           f'{len(train_ids)} training clients')
    train_ids = train_ids[:cfg.max_train_clients]
  public_ids: list = []
  if cfg.precondition != 'none' and cfg.side_info == 'public_clients':
    # Held-out public/proxy clients (the paper's OOD setting): removed from the private population.
    public_ids, train_ids = train_ids[:cfg.num_public_clients], train_ids[cfg.num_public_clients:]
  evaluation_data, train_ids = _evaluation(cfg, task, train_ids,
                                           run_dir.secret_file(HOLDOUT_KEY_FILE))
  # Inserted canaries are clients of the population: sampled, and counted in N and q.
  population = canary_run.population(train_ids, cfg.num_canaries)
  sampler = _sampler(config.sampling, population, run_dir.secret_file(SAMPLING_KEY_FILE),
                     cfg.resume)
  tree = cfg.dp in aggregators.TREE_KINDS
  delta = accounting.check_delta(
      cfg.delta if cfg.delta is not None else accounting.suggested_delta(len(population)),
      len(population))
  accountant = None
  if cfg.dp != 'none':
    # PLD at a 1e-3 value grid: dp_accounting discretizes pessimistically (a valid upper
    # bound), measured equal to the 1e-4 grid to 8 digits here and 10x faster per round; the
    # post-hoc `python -m tff_dp.accounting` replays the ledger at the finer default.
    accountant = accounting.LedgerAccountant(
        delta=delta, methods=tuple(cfg.accounting), pld_every=cfg.pld_every,
        pld_value_discretization_interval=1e-3,
        neighboring_relation=accounting.TREE_RELATION if tree else 'add_remove')

  client_optimizer = optimizers.build_optimizer(cfg.client_optimizer, cfg.client_learning_rate)
  server_optimizer = optimizers.build_optimizer(
      cfg.server_optimizer, cfg.server_learning_rate, momentum=cfg.server_momentum)
  aggregator = dp_factory = build_aggregator(config.dp, cfg.clients_per_round,
                                             getattr(sampler, 'rounds_per_epoch', None))
  if cfg.precondition != 'none':
    scales = adadps_setup.scales_for_task(
        task, cfg.side_info, public_client_ids=public_ids, cap=cfg.precondition_cap,
        division=cfg.precondition_division, eps=cfg.precondition_eps,
        preconditioner=cfg.preconditioner, num_frequent=cfg.precondition_num_frequent,
        rare_scale=cfg.precondition_rare_scale)
    if cfg.precondition == 'client':
      client_optimizer = adadps_setup.client_optimizer(
          cfg.client_optimizer, cfg.client_learning_rate, scales)
    else:
      aggregator = adadps_setup.server_aggregator(scales, aggregator)

  uniform = cfg.weighting == 'uniform'
  if uniform:
    # Outermost: a NaN/Inf client update is zeroed before any clipping or preconditioning.
    aggregator = non_finite.NonFiniteZeroingFactory(
        aggregator if aggregator is not None else tff.aggregators.UnweightedMeanFactory())
  # TFF's build_unweighted_fed_avg (or, by example count, build_weighted_fed_avg with its
  # default mean), less the per-client model initializers (see fed_avg.py).
  process = fed_avg.build_fed_avg(
      task.model_fn, client_optimizer=client_optimizer, server_optimizer=server_optimizer,
      model_aggregator=aggregator if uniform else None, uniform=uniform,
      loop_implementation=LOOP_IMPLEMENTATIONS[cfg.loop_implementation],
      canaries=bool(cfg.num_canaries))
  canaries = _canaries(config.canaries, process, task, train_ids,
                       run_dir.secret_file(canary_run.KEY_FILE), cfg.resume)
  if cfg.datasets_on_workers:
    process = _with_datasets_on_workers(process, task)
  stop.raise_if_received('during start-up')

  planned_queries: tuple = ()
  if cfg.max_epsilon is not None:
    planned_queries = first_round_queries(process)
    if not cfg.resume:
      first = accountant.peek_epsilon(ledger_lib.RoundRecord(
          1, sampler.sampling_event(1), planned_queries, 1 if tree else None))
      if first > cfg.max_epsilon:
        raise UserInputError(
            f'`max_epsilon={cfg.max_epsilon:g}`: the first round alone would reach epsilon '
            f'{first:.4g} at delta {delta:g}; raise `max_epsilon` or `noise_multiplier` '
            '(nothing was written)')

  # Built after the process: TFF traces model_fn inside a tf.compat.v1.Graph, which invalidates
  # Keras models created before it ("Your Layer or Model is in an invalid state").
  evaluator = evaluation.CentralizedEvaluator(
      task.keras_model_fn, task.loss_fn, task.metrics_fn,
      _eval_dataset(task, cfg.max_eval_examples, cfg.seed, evaluation_data.clients))
  # Integer labels/tokens must index the model's outputs (checked once per client).
  max_index = evaluator.output_dim
  clip_group_labels = _clip_group_labels(dp_factory, evaluator.trainable_weight_names)
  aggregates, train_policy = _checkpoint_aggregation(config.checkpoint_aggregation)
  stop.raise_if_received('during start-up')

  if cfg.resume and cfg.dp != 'none':
    ledger_lib.check_resumable(run_dir.file('ledger.jsonl'))   # Refused before any write.
  facts = release.RunFacts(
      dp=cfg.dp != 'none', noise_state_in_checkpoints=tree,
      eval_covered=evaluation_data.covered, seeded=cfg.sampling_seed is not None,
      private_release=cfg.private_release)
  run_dir.create(secret_checkpoints=facts.noise_state_in_checkpoints,
                 tensorboard=not cfg.private_release)
  run_dir.write_config(dict(config.settings(), delta_used=delta,
                            population_size=len(population), task=task.name),
                       changes=changes)
  # A new run keeps its secret keys under secret/; a resumed one read them (`_sampler`,
  # `_evaluation` and `_canaries` refuse to resume without them).
  if isinstance(sampler, sampling.ShuffledSampler) and sampler.secret and not cfg.resume:
    sampling.save_key(run_dir.secret_file(SAMPLING_KEY_FILE), sampler.key)
  if canaries is not None and canaries.directions.key is not None and not cfg.resume:
    sampling.save_key(run_dir.secret_file(canary_run.KEY_FILE), canaries.directions.key)
  if evaluation_data.key_to_save is not None:
    sampling.save_key(run_dir.secret_file(HOLDOUT_KEY_FILE), evaluation_data.key_to_save)
  ledger = None
  if cfg.dp != 'none':
    # On resume, a partial last line is a record whose round released nothing (outputs are
    # released only after the append completes): it is moved aside, never silently dropped.
    ledger = ledger_lib.PrivacyLedger(run_dir.file('ledger.jsonl'), repair=cfg.resume)
    if ledger.repaired_to:
      log(f'ledger: partial last line from a crash moved to {ledger.repaired_to}')

  parts = components.LoopComponents(
      process=process, run_dir=run_dir, sampler=sampler,
      client_dataset_fn=_client_dataset_fn(task),
      evaluator=evaluator, ledger=ledger, accountant=accountant,
      aggregates=aggregates, train_on_aggregate=train_policy, log=log,
      planned_queries=planned_queries, planned_tree_leaf=1 if tree else None,
      clip_group_labels=clip_group_labels,
      check_client_fn=lambda ds: client_data.check_client_dataset(ds, max_index),
      client_value_fn=client_id_argument if cfg.datasets_on_workers else None,
      canaries=canaries)
  loop_config = components.LoopConfig(
      total_rounds=cfg.total_rounds, rounds_per_eval=cfg.rounds_per_eval,
      rounds_per_checkpoint=config.rounds_per_checkpoint, delta=delta,
      max_epsilon=cfg.max_epsilon, uncertainty_last_k=cfg.uncertainty_last_k,
      dp=cfg.dp, release_facts=facts, eval_description=evaluation_data.description,
      side_information=_side_information(cfg), client_cache_size=cfg.client_cache_size, prefetch_clients=cfg.prefetch_clients,
      worker_restart_rounds=cfg.worker_restart_rounds)
  return loop_config, parts


def _canaries(cfg: config_lib.CanaryConfig, process, task, train_ids, key_path: str,
              resume: bool) -> Optional[canary_run.CanaryRun]:
  """The run's canaries (None without): directions in the dimension of the model's trainable
  weights, from `canary_seed`, or from the key at `key_path` (a resume), or a new key."""
  if not cfg.num_canaries:
    return None
  shapes = [w.shape for w in process.get_model_weights(process.initialize()).trainable]
  key = None
  if cfg.canary_seed is None:
    key = sampling.load_key(key_path, what='canary key')
    if key is None and resume:
      raise UserInputError(f'`resume`: {key_path} is missing; without the canary key the '
                           'canary statistics cannot be continued')
  directions = canaries_lib.CanaryDirections(
      canaries_lib.dimension(shapes), cfg.num_canaries, cfg.unseen, seed=cfg.canary_seed,
      key=key, base_fn=canary_insertion.tf_base_vector)
  dataset_fn = _client_dataset_fn(task)
  return canary_run.CanaryRun(directions, lambda: dataset_fn(train_ids[0]).take(0))


def _clip_group_labels(dp_factory, weight_names: list[str]) -> dict[str, str]:
  """'group_g' -> the names of its weights, for per-group (per-layer, joint) clip factories.

  Their `groups` (flat weight indices per group) are set when the process was built."""
  groups = getattr(dp_factory, 'groups', None) or []
  return {f'group_{g}': ', '.join(weight_names[i] for i in members)
          for g, members in enumerate(groups) if all(i < len(weight_names) for i in members)}


def _with_datasets_on_workers(process, task):
  """`process` whose `next` takes client ids (tf.string at CLIENTS) and builds each client's
  preprocessed dataset where the client runs, with the task's dataset computation.

  The round's DP aggregation, state and measurements are those of `process` (TFF only maps the
  dataset computation over the ids before `process.next`'s body), so ledger and accounting are
  unchanged. The loop passes only ids of clients the coordinator checked (sampled from the
  task's client ids, data read and checked once, as in the default mode).
  """
  try:
    computation = getattr(task, 'train_dataset_computation', None)
  except ValueError:   # A FederatedTask whose data cannot be read from a traced id.
    computation = None
  if computation is None:
    raise UserInputError(f'`datasets_on_workers`: task {getattr(task, "name", task)!r} has no '
                         'dataset computation of a client id (train_dataset_computation)')
  return tff.simulation.compose_dataset_computation_with_learning_process(computation, process)


def client_id_argument(client_id, dataset=None):
  """A client id as the `process.next` argument of `_with_datasets_on_workers`: UTF-8 bytes.

  TFF 0.87 serializes a Python str argument with `np.asarray(value, np.bytes_)`, which fails on
  any non-ASCII id (UnicodeEncodeError) and drops trailing NULs; bytes go through unchanged.
  """
  del dataset   # Checked by the loop; built again on the worker.
  return client_id.encode('utf-8') if isinstance(client_id, str) else client_id


def _client_dataset_fn(task):
  """client id -> preprocessed training dataset; the task's faster builder when it has one."""
  if hasattr(task, 'train_dataset_for_client'):
    return task.train_dataset_for_client
  return lambda cid: task.preprocess_train(task.train_data.create_tf_dataset_for_client(cid))


def _side_information(cfg) -> Optional[str]:
  """What the statement says of AdaDPS side information (None without AdaDPS)."""
  if cfg.precondition == 'none':
    return None
  if cfg.side_info in ('word_freq', 'tag_freq'):
    return (f'AdaDPS side information ({cfg.side_info}): counts over the whole dataset, the '
            'training clients\' own data included, used as public (as in the AdaDPS paper); '
            'not covered by the DP guarantee')
  if cfg.side_info == 'public_clients':
    return (f'AdaDPS side information from {cfg.num_public_clients} public clients, removed '
            'from the training population')
  return f'AdaDPS side information read from {cfg.side_info[5:]}, declared public by the operator'


def _checkpoint_aggregation(cfg: config_lib.CheckpointAggregationConfig):
  aggregates = {}
  policy = None
  if cfg.ema_beta is None and not cfg.past_k and cfg.train_on_aggregate == 'none':
    return aggregates, policy
  if cfg.ema_beta is not None:
    aggregates['ema'] = ca.EMAAggregate(cfg.ema_beta)
  if cfg.past_k:
    aggregates['past_k'] = ca.PastKAverage(cfg.past_k)
  if cfg.train_on_aggregate != 'none':
    policy = ca.TrainOnAggregate(cfg.train_on_aggregate, start_round=cfg.aggregate_start_round)
  return aggregates, policy
