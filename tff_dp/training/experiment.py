"""Builds every component of a DP-FedAvg experiment from an `ExperimentConfig` and runs it.

The task is passed in (duck-typed, Contract 3 in docs/ARCHITECTURE.md), so this library module
does not depend on the `tasks` package. Validation happens before the run directory is touched.
"""

import contextlib
import dataclasses
import json
import math
import os
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import accounting
from tff_dp import aggregators
from tff_dp import checkpoint_aggregation as ca
from tff_dp import ledger as ledger_lib
from tff_dp import sampling
from tff_dp.aggregators import non_finite
from tff_dp.aggregators import privacy_queries as privacy_queries_lib
from tff_dp.aggregators import tree_aggregation
from tff_dp.errors import UserInputError
from tff_dp.training import adadps_setup
from tff_dp.training import client_data
from tff_dp.training import evaluation
from tff_dp.training import fed_avg
from tff_dp.training import loop
from tff_dp.training import optimizers
from tff_dp.training import run_dir as run_dir_lib
from tff_dp.training import stop_signal

DP_KINDS = ('none',) + aggregators.DP_KINDS
CLIENT_SAMPLINGS = ('poisson', 'fixed_size', 'shuffled')
# The shuffled sampler's secret key, kept in the run directory for resume (tff_dp.sampling).
SAMPLING_KEY_FILE = 'sampling_key.secret'
# `--loop_implementation` -> TFF's client training loop. dataset_iterator: a Python `for` over
# the dataset inside the client's tf.function; dataset_reduce (TFF's default): one
# DatasetReduce op. They run the same steps in the same order (same model, to float rounding).
LOOP_IMPLEMENTATIONS = {
    'dataset_iterator': tff.learning.LoopImplementation.DATASET_ITERATOR,
    'dataset_reduce': tff.learning.LoopImplementation.DATASET_REDUCE,
}


@dataclasses.dataclass
class ExperimentConfig:
  """All knobs of a run (the CLI maps its flags 1:1 onto these fields)."""
  root_output_dir: str
  experiment_name: str
  resume: bool = False
  seed: int = 0                             # Model init, client data order, eval subset.
  # None: each round's sample is drawn from OS randomness (secret); an int makes the samples
  # reproducible from it, and the privacy statement says they are known to its holders.
  sampling_seed: Optional[int] = None
  # Keep every non-private diagnostic out of the console, metrics, TensorBoard and plots.
  private_release: bool = False
  # Task and data settings (name, data_dir, batch size, ...): recorded and compared on resume.
  task_settings: dict = dataclasses.field(default_factory=dict)
  # Execution settings (workers, concurrency): recorded; they may change on resume.
  runtime_settings: dict = dataclasses.field(default_factory=dict)
  # Rounds and clients.
  total_rounds: int = 20
  clients_per_round: int = 10
  max_train_clients: Optional[int] = None   # Only the first N training clients (a subset).
  client_sampling: str = 'poisson'          # poisson | fixed_size | shuffled (DP-FTRL)
  weighting: str = 'uniform'                # uniform | num_examples (non-DP only)
  rounds_per_eval: int = 1
  rounds_per_checkpoint: int = 10
  max_eval_examples: int = 2000
  client_cache_size: int = 1000             # Preprocessed client datasets kept in memory.
  prefetch_clients: bool = True             # Build the next round's datasets during a round.
  # Replace the local TFF worker by a fresh process every N rounds (0: never), which bounds its
  # memory over long runs (`tff_dp.runtime.restart_local_worker`). Same results.
  worker_restart_rounds: int = 0
  # How TFF expresses a client's pass over its batches (`LOOP_IMPLEMENTATIONS`): the same SGD
  # steps either way; the iterator loop measured 1.2-1.5x faster than TFF's default
  # DatasetReduce on CPU (benchmarks/bench_limit.py: tff vs tff_iterator).
  loop_implementation: str = 'dataset_iterator'
  # Build each sampled client's training dataset on the TFF workers from its id (the task's
  # `train_dataset_computation` composed into the learning process with
  # `tff.simulation.compose_dataset_computation_with_learning_process`): a round sends client
  # ids instead of serialized dataset graphs. Every worker must see the task's data files at the
  # same path as the coordinator. Same elements, same rejections, same results.
  datasets_on_workers: bool = False
  # Optimizers.
  client_optimizer: str = 'sgd'
  client_learning_rate: float = 0.1
  server_optimizer: str = 'sgd'
  server_learning_rate: float = 1.0
  server_momentum: float = 0.9
  # Differential privacy.
  dp: str = 'adaptive'
  clip: Optional[float] = None
  noise_multiplier: Optional[float] = None
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  clip_update_rule: str = 'geometric'
  clipped_count_stddev: Optional[float] = None
  noise_allocation: str = 'proportional'
  restart_warmup: int = 128                 # ftrl_adaptive: first tree restart (TFF default)
  restart_frequency: int = 1024             # ftrl_adaptive: then every this many rounds
  delta: Optional[float] = None
  max_epsilon: Optional[float] = None
  accounting: tuple = ('rdp', 'pld')
  pld_every: int = 10
  # AdaDPS.
  precondition: str = 'none'                # none | client | server
  side_info: str = 'word_freq'              # word_freq | public_clients | file:PATH
  precondition_cap: float = 1000.0
  precondition_division: float = 1.0
  precondition_eps: float = 1e-8
  preconditioner: str = 'auto'              # auto | frequency | rank | second_moment | direct
  precondition_num_frequent: int = 100      # rank: the most frequent tokens keep scale 1 ...
  precondition_rare_scale: float = 200.0    # ... and all others get this scale.
  num_public_clients: int = 10
  # Checkpoint aggregation.
  ema_beta: Optional[float] = None
  past_k: int = 0
  train_on_aggregate: str = 'none'
  aggregate_start_round: int = 0
  uncertainty_last_k: int = 0
  # What this run reproduces (recorded in config.json for `python -m tff_dp.tables`).
  paper_table: str = ''                     # e.g. 'Andrew et al. 2021, Table 2 (EMNIST)'
  paper_arm: str = ''                       # e.g. 'adaptive, z=0.1'
  paper_results: dict = dataclasses.field(default_factory=dict)  # e.g. {'accuracy': 0.83}
  paper_note: str = ''                      # Free text shown under the table.

  def validate(self) -> None:
    """Raises UserInputError naming the first bad setting (before anything touches disk)."""
    def need(cond, msg):
      if not cond:
        raise UserInputError(msg)
    for name in _FLOAT_FIELDS:
      value = getattr(self, name)
      need(value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value)),
           f'`{name}` must be a finite number, got {value!r}')
    need(bool(self.experiment_name) and os.sep not in self.experiment_name
         and self.experiment_name not in ('.', '..'),
         f'`experiment_name` must be a plain non-empty name, got {self.experiment_name!r}')
    need(self.total_rounds >= 1, f'`total_rounds` must be >= 1, got {self.total_rounds}')
    need(self.worker_restart_rounds >= 0,
         f'`worker_restart_rounds` must be >= 0, got {self.worker_restart_rounds}')
    need(0 <= self.seed < 2**32, f'`seed` must be in [0, 2^32), got {self.seed}')
    need(self.sampling_seed is None or 0 <= self.sampling_seed < 2**63,
         f'`sampling_seed` must be in [0, 2^63) when set, got {self.sampling_seed}')
    need(self.clients_per_round >= 1,
         f'`clients_per_round` must be a positive integer, got {self.clients_per_round}')
    need(self.rounds_per_eval >= 1, f'`rounds_per_eval` must be >= 1, got {self.rounds_per_eval}')
    need(self.max_train_clients is None or self.max_train_clients >= 1,
         f'`max_train_clients` must be >= 1 when set, got {self.max_train_clients}')
    need(self.client_cache_size >= 0,
         f'`client_cache_size` must be >= 0, got {self.client_cache_size}')
    need(self.rounds_per_checkpoint >= 1,
         f'`rounds_per_checkpoint` must be >= 1, got {self.rounds_per_checkpoint}')
    need(self.max_eval_examples >= 0,
         f'`max_eval_examples` must be >= 0 (0: all), got {self.max_eval_examples}')
    need(self.loop_implementation in LOOP_IMPLEMENTATIONS,
         f'`loop_implementation` must be one of {", ".join(LOOP_IMPLEMENTATIONS)}, got '
         f'{self.loop_implementation!r}')
    need(isinstance(self.datasets_on_workers, bool),
         f'`datasets_on_workers` must be true or false, got {self.datasets_on_workers!r}')
    need(self.client_sampling in CLIENT_SAMPLINGS,
         f'`client_sampling` must be one of {", ".join(CLIENT_SAMPLINGS)}, got '
         f'{self.client_sampling!r}')
    need(self.client_optimizer in optimizers.OPTIMIZER_NAMES,
         f'`client_optimizer` must be one of {", ".join(optimizers.OPTIMIZER_NAMES)}, got '
         f'{self.client_optimizer!r}')
    need(self.server_optimizer in optimizers.OPTIMIZER_NAMES,
         f'`server_optimizer` must be one of {", ".join(optimizers.OPTIMIZER_NAMES)}, got '
         f'{self.server_optimizer!r}')
    need(self.client_learning_rate > 0,
         f'`client_learning_rate` must be positive, got {self.client_learning_rate}')
    need(self.server_learning_rate > 0,
         f'`server_learning_rate` must be positive, got {self.server_learning_rate}')
    need(0 <= self.server_momentum < 1,
         f'`server_momentum` must be in [0, 1), got {self.server_momentum}')
    need(self.dp in DP_KINDS, f'`dp` must be one of {", ".join(DP_KINDS)}, got {self.dp!r}')
    methods = tuple(self.accounting)
    need(bool(methods) and all(m in ('rdp', 'pld') for m in methods)
         and len(set(methods)) == len(methods),
         f'`accounting` must be a non-empty list of rdp, pld, got {",".join(methods)!r}')
    need(self.pld_every >= 1, f'`pld_every` must be >= 1, got {self.pld_every}')
    need(0 < self.target_unclipped_quantile < 1,
         f'`target_unclipped_quantile` must be in (0, 1), got {self.target_unclipped_quantile}')
    need(self.clip_learning_rate > 0,
         f'`clip_learning_rate` must be positive, got {self.clip_learning_rate}')
    need(self.clip_update_rule in ('geometric', 'linear'),
         f'`clip_update_rule` must be geometric or linear, got {self.clip_update_rule!r}')
    need(self.clipped_count_stddev is None or self.clipped_count_stddev >= 0,
         f'`clipped_count_stddev` must be >= 0 when set, got {self.clipped_count_stddev}')
    need(self.noise_allocation in ('proportional', 'dimensionality'),
         f'`noise_allocation` must be proportional or dimensionality, got '
         f'{self.noise_allocation!r}')
    if self.dp != 'none':
      accounting.check_analysable(self.client_sampling, self.dp in aggregators.TREE_KINDS)
    if self.dp in aggregators.TREE_KINDS:
      need(self.rounds_per_checkpoint == 1,
           f'`dp={self.dp}` needs `rounds_per_checkpoint=1`: a resume must not re-execute a '
           'round whose output was released (the tree accounting does not cover it)')
    if self.dp == 'ftrl_adaptive':
      tree_aggregation.check_restarts(self.restart_warmup, self.restart_frequency)
    if self.dp == 'none':
      need(self.noise_multiplier in (None, 0.0),
           f'`noise_multiplier` needs DP: set `dp={"|".join(aggregators.DP_KINDS)}`')
    else:
      need(self.weighting == 'uniform',
           f'`dp={self.dp}` requires uniform client weighting (`weighting=uniform`): a client '
           'weighted by its example count could exceed the clip-based sensitivity')
      need(self.clip is not None,
           f'`dp={self.dp}` needs `clip` (the fixed clip, or the initial clip when adaptive): '
           'noise without a clip norm has no sensitivity to calibrate to')
      need(self.clip > 0, f'`clip` must be positive, got {self.clip}')
      need(self.noise_multiplier is not None and self.noise_multiplier >= 0,
           f'`dp={self.dp}` needs `noise_multiplier` >= 0')
    need(self.precondition in ('none', 'client', 'server'),
         f'`precondition` must be none, client or server, got {self.precondition!r}')
    for name in ('precondition_cap', 'precondition_division', 'precondition_eps',
                 'precondition_rare_scale'):
      need(getattr(self, name) > 0, f'`{name}` must be positive, got {getattr(self, name)}')
    need(self.precondition_num_frequent >= 0,
         f'`precondition_num_frequent` must be >= 0, got {self.precondition_num_frequent}')
    need(self.num_public_clients >= 1,
         f'`num_public_clients` must be >= 1, got {self.num_public_clients}')
    need(self.ema_beta is None or 0 <= self.ema_beta < 1,
         f'`ema_beta` must be in [0, 1) when set, got {self.ema_beta}')
    need(self.past_k >= 0, f'`past_k` must be >= 0, got {self.past_k}')
    need(self.aggregate_start_round >= 0,
         f'`aggregate_start_round` must be >= 0, got {self.aggregate_start_round}')
    need(self.uncertainty_last_k == 0 or self.uncertainty_last_k >= 2,
         '`uncertainty_last_k` must be 0 (off) or >= 2 (a spread needs two checkpoints), got '
         f'{self.uncertainty_last_k}')
    need(self.train_on_aggregate in ('none', 'ema', 'past_k'),
         f'`train_on_aggregate` must be none, ema or past_k, got {self.train_on_aggregate!r}')
    if self.train_on_aggregate == 'ema':
      need(self.ema_beta is not None, '`train_on_aggregate=ema` needs `ema_beta`')
    if self.train_on_aggregate == 'past_k':
      need(self.past_k >= 1, '`train_on_aggregate=past_k` needs `past_k` >= 1')
    if self.max_epsilon is not None:
      need(self.max_epsilon > 0, f'`max_epsilon` must be positive, got {self.max_epsilon}')
      need(self.dp != 'none', '`max_epsilon` needs DP (`dp` != none)')
    if self.delta is not None:
      need(0 < self.delta < 1, f'`delta` must be in (0, 1), got {self.delta}')
    for key, value in self.paper_results.items():
      need(isinstance(value, (int, float)) and not isinstance(value, bool)
           and math.isfinite(value),
           f'`paper_results`: {key} must be a finite number, got {value!r}')


_FLOAT_FIELDS = tuple(f.name for f in dataclasses.fields(ExperimentConfig)
                      if f.type in (float, Optional[float]))

# Settings a resumed run may change (cadence, stopping, reporting and execution); any other
# change would make the resumed run a different mechanism, model or data than the one the
# ledger and checkpoints describe, and is refused. loop_implementation is execution: it picks
# how TFF expresses the same client SGD steps, and the state it reads and writes is the same.
# datasets_on_workers is execution too: where the same client pipelines are built.
RESUMABLE_CHANGES = ('total_rounds', 'max_epsilon', 'rounds_per_eval',
                     'rounds_per_checkpoint', 'max_eval_examples', 'pld_every', 'accounting',
                     'client_cache_size', 'prefetch_clients', 'worker_restart_rounds',
                     'loop_implementation',
                     'datasets_on_workers', 'runtime_settings', 'paper_table', 'paper_arm', 'paper_results',
                     'paper_note')


def resume_changes(recorded: dict[str, Any], cfg: ExperimentConfig) -> dict[str, tuple]:
  """{setting: (recorded value, new value)} for every setting that differs on resume.

  Raises UserInputError naming each differing setting outside `RESUMABLE_CHANGES`; nested
  settings (task_settings) are compared key by key. Settings a run directory written by an
  older version did not record are not compared.
  """
  new = json.loads(json.dumps(dataclasses.asdict(cfg)))   # JSON types, as recorded.
  changes = {}
  for name, value in new.items():
    if name not in recorded or name == 'resume':
      continue
    old = recorded[name]
    if isinstance(value, dict) and isinstance(old, dict) and name != 'paper_results':
      for key in sorted(set(value) | set(old)):
        if value.get(key) != old.get(key):
          changes[f'{name}.{key}'] = (old.get(key), value.get(key))
    elif value != old:
      changes[name] = (old, value)
  refused = {k: v for k, v in changes.items() if k.split('.')[0] not in RESUMABLE_CHANGES}
  if refused:
    listed = '; '.join(f'{k} was {old!r}, now {new_value!r}'
                       for k, (old, new_value) in refused.items())
    raise UserInputError(
        f'cannot resume {os.path.join(cfg.root_output_dir, cfg.experiment_name)} with '
        f'different settings: {listed}. A resumed run must be the same mechanism, model and '
        f'data; only {", ".join(RESUMABLE_CHANGES)} may change (nothing was changed)')
  return changes


def build_aggregator(cfg: ExperimentConfig, rounds_per_epoch: Optional[int] = None):
  """The model-update aggregation factory for `cfg.dp` (None = TFF's default mean).

  `rounds_per_epoch`: the tree factories restart after every epoch of the shuffled sampler."""
  if cfg.dp == 'none':
    return None
  kwargs = dict(
      noise_multiplier=float(cfg.noise_multiplier),
      clients_per_round=float(cfg.clients_per_round),
      clip=float(cfg.clip),
      target_unclipped_quantile=cfg.target_unclipped_quantile,
      clip_learning_rate=cfg.clip_learning_rate,
      update_rule=cfg.clip_update_rule,
      clipped_count_stddev=cfg.clipped_count_stddev,
      noise_allocation=cfg.noise_allocation,
  )
  if cfg.dp in aggregators.TREE_KINDS:
    kwargs['rounds_per_epoch'] = rounds_per_epoch
  if cfg.dp == 'ftrl_adaptive':
    kwargs.update(restart_warmup=cfg.restart_warmup, restart_frequency=cfg.restart_frequency)
  return aggregators.build_dp_aggregator(cfg.dp, **kwargs)


def _sampler(cfg: ExperimentConfig, client_ids, key_path: str):
  population = len(client_ids)
  if population == 0:
    raise UserInputError('the training data has no clients')
  if cfg.clients_per_round > population:
    raise UserInputError(f'`clients_per_round={cfg.clients_per_round}` exceeds the '
                         f'{population} training clients')
  if cfg.client_sampling == 'poisson':
    return sampling.PoissonSampler(client_ids, cfg.clients_per_round / population,
                                   seed=cfg.sampling_seed)
  if cfg.client_sampling == 'shuffled':
    key = sampling.load_key(key_path) if cfg.sampling_seed is None else None
    if key is None and cfg.sampling_seed is None and cfg.resume:
      raise UserInputError(f'`resume`: {key_path} is missing; without the shuffling key the '
                           'epochs cannot be continued (clients could participate twice)')
    return sampling.ShuffledSampler(client_ids, cfg.clients_per_round, seed=cfg.sampling_seed,
                                    key=key)
  return sampling.FixedSizeSampler(client_ids, cfg.clients_per_round, seed=cfg.sampling_seed)


def _eval_dataset(task, max_examples: int, seed: int):
  # TFF shuffles the client order with an unseeded RNG unless given a seed: with
  # --max_eval_examples the evaluated subset would differ between runs (and across a resume).
  raw = task.test_data.create_tf_dataset_from_all_clients(seed=seed)
  if max_examples:
    raw = raw.take(max_examples)
  return task.preprocess_eval(raw)


def first_round_queries(process) -> tuple[ledger_lib.GaussianSumQuery, ...]:
  """The Gaussian sum queries round 1 will execute, read from a round run on no client.

  The learning process runs one round on zero clients from its initial state (no client data
  is touched, so this costs no privacy; the result is discarded): the aggregator reports the
  (clip, noise stddev) tuples of its pre-round state exactly as it will in round 1.
  """
  output = process.next(process.initialize(), [])
  return tuple(privacy_queries_lib.find_privacy_queries(output.metrics['aggregator']))


def run(cfg: ExperimentConfig, task, *, log=print,
        stop: Optional[stop_signal.StopSignal] = None) -> dict[str, Any]:
  """Validates `cfg`, builds everything, and runs (or resumes) the experiment.

  `stop`: an installed `StopSignal` (a program installs it at start-up so that a signal during
  start-up is seen too); None installs one for the duration of the run. A signal before round
  1 raises `errors.RunInterrupted` before anything is written.

  Computations run in the current TFF context. The CLI installs
  `tff_dp.runtime.configure_execution_context()`; an in-process caller should too for long
  runs, since TFF's import-time context keeps a worker executor per client count for good (with
  Poisson sampling, tens of MB per round: issue 13).
  """
  with contextlib.ExitStack() as stack:
    if stop is None:
      stop = stack.enter_context(stop_signal.StopSignal(log))
    return _run(cfg, task, log, stop)


def _run(cfg: ExperimentConfig, task, log, stop: stop_signal.StopSignal) -> dict[str, Any]:
  cfg.validate()
  stop.raise_if_received('during start-up')
  run_dir = run_dir_lib.RunDirectory(cfg.root_output_dir, cfg.experiment_name, resume=cfg.resume)
  try:
    return _build_and_run(cfg, task, log, stop, run_dir)
  finally:
    run_dir.close()


def _build_and_run(cfg: ExperimentConfig, task, log, stop: stop_signal.StopSignal,
                   run_dir: run_dir_lib.RunDirectory) -> dict[str, Any]:
  changes = resume_changes(run_dir.read_config(), cfg) if cfg.resume else {}
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
  sampler = _sampler(cfg, train_ids, run_dir.file(SAMPLING_KEY_FILE))
  tree = cfg.dp in aggregators.TREE_KINDS
  delta = cfg.delta if cfg.delta is not None else _default_delta(len(train_ids))
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
  aggregator = dp_factory = build_aggregator(
      cfg, getattr(sampler, 'rounds_per_epoch', None))
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
      loop_implementation=LOOP_IMPLEMENTATIONS[cfg.loop_implementation])
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
      _eval_dataset(task, cfg.max_eval_examples, cfg.seed))
  # Integer labels/tokens must index the model's outputs (checked once per client).
  max_index = evaluator.output_dim
  clip_group_labels = _clip_group_labels(dp_factory, evaluator.trainable_weight_names)
  aggregates, train_policy = _checkpoint_aggregation(cfg)
  stop.raise_if_received('during start-up')

  run_dir.create()
  if isinstance(sampler, sampling.ShuffledSampler) and sampler.secret and (
      sampling.load_key(run_dir.file(SAMPLING_KEY_FILE)) is None):
    sampling.save_key(run_dir.file(SAMPLING_KEY_FILE), sampler.key)
  run_dir.write_config(dict(dataclasses.asdict(cfg), delta_used=delta,
                            population_size=len(train_ids), task=task.name),
                       changes=changes)
  ledger = None
  if cfg.dp != 'none':
    # On resume, a partial last line is a record whose round released nothing (outputs are
    # released only after the append completes): it is moved aside, never silently dropped.
    ledger = ledger_lib.PrivacyLedger(run_dir.file('ledger.jsonl'), repair=cfg.resume)
    if ledger.repaired_to:
      log(f'ledger: partial last line from a crash moved to {ledger.repaired_to}')

  components = loop.LoopComponents(
      process=process, run_dir=run_dir, sampler=sampler,
      client_dataset_fn=_client_dataset_fn(task),
      evaluator=evaluator, ledger=ledger, accountant=accountant,
      aggregates=aggregates, train_on_aggregate=train_policy, log=log,
      planned_queries=planned_queries, planned_tree_leaf=1 if tree else None,
      clip_group_labels=clip_group_labels,
      check_client_fn=lambda ds: client_data.check_client_dataset(ds, max_index),
      client_value_fn=client_id_argument if cfg.datasets_on_workers else None)
  loop_config = loop.LoopConfig(
      total_rounds=cfg.total_rounds, rounds_per_eval=cfg.rounds_per_eval,
      rounds_per_checkpoint=cfg.rounds_per_checkpoint, delta=delta,
      max_epsilon=cfg.max_epsilon, uncertainty_last_k=cfg.uncertainty_last_k,
      dp=cfg.dp, private_release=cfg.private_release,
      client_cache_size=cfg.client_cache_size, prefetch_clients=cfg.prefetch_clients,
      worker_restart_rounds=cfg.worker_restart_rounds)
  log(f'run directory: {run_dir.path}  (population {len(train_ids)}, '
      f'{cfg.client_sampling} sampling, '
      f'{"secret" if sampler.secret else "seeded"} samples, delta {delta:g})')
  summary = loop.run_training(loop_config, components, stop)
  summary['run_dir'] = run_dir.path
  return summary


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


def _default_delta(population: int) -> float:
  """delta below 1/population, the usual requirement for user-level DP."""
  return min(1e-5, 10 ** math.floor(math.log10(1.0 / population) - 1))


def _checkpoint_aggregation(cfg: ExperimentConfig):
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
