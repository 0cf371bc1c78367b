"""Builds every component of a DP-FedAvg experiment from an `ExperimentConfig` and runs it.

The task is passed in (duck-typed, Contract 3 in docs/ARCHITECTURE.md), so this library module
does not depend on the `tasks` package. Validation happens before the run directory is touched.
"""

import dataclasses
import math
from typing import Any, Optional

import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import ledger as ledger_lib
from tff_dp import sampling
from tff_dp.errors import UserInputError
from tff_dp.training import client_data
from tff_dp.training import evaluation
from tff_dp.training import loop
from tff_dp.training import optimizers
from tff_dp.training import run_dir as run_dir_lib

DP_KINDS = ('none', 'fixed', 'adaptive', 'per_layer_adaptive', 'joint')


@dataclasses.dataclass
class ExperimentConfig:
  """All knobs of a run (the CLI maps its flags 1:1 onto these fields)."""
  root_output_dir: str
  experiment_name: str
  resume: bool = False
  seed: int = 0
  # Rounds and clients.
  total_rounds: int = 20
  clients_per_round: int = 10
  max_train_clients: Optional[int] = None   # Only the first N training clients (a subset).
  client_sampling: str = 'poisson'          # poisson | fixed_size
  weighting: str = 'uniform'                # uniform | num_examples (non-DP only)
  rounds_per_eval: int = 1
  rounds_per_checkpoint: int = 10
  max_eval_examples: int = 2000
  client_cache_size: int = 1000             # Preprocessed client datasets kept in memory.
  prefetch_clients: bool = True             # Build the next round's datasets during a round.
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
    """Raises UserInputError naming the first bad setting."""
    def need(cond, msg):
      if not cond:
        raise UserInputError(msg)
    need(self.total_rounds >= 1, f'--total_rounds must be >= 1, got {self.total_rounds}')
    need(0 <= self.seed < 2**32, f'--seed must be in [0, 2^32), got {self.seed}')
    need(self.clients_per_round >= 1,
         f'--clients_per_round must be a positive integer, got {self.clients_per_round}')
    need(self.rounds_per_eval >= 1, f'--rounds_per_eval must be >= 1, got {self.rounds_per_eval}')
    need(self.max_train_clients is None or self.max_train_clients >= 1,
         f'--max_train_clients must be >= 1 when set, got {self.max_train_clients}')
    need(self.client_cache_size >= 0,
         f'--client_cache_size must be >= 0, got {self.client_cache_size}')
    need(self.rounds_per_checkpoint >= 1,
         f'--rounds_per_checkpoint must be >= 1, got {self.rounds_per_checkpoint}')
    need(self.client_sampling in ('poisson', 'fixed_size'),
         f'--client_sampling must be poisson or fixed_size, got {self.client_sampling!r}')
    need(self.dp in DP_KINDS, f'--dp must be one of {", ".join(DP_KINDS)}, got {self.dp!r}')
    if self.dp == 'none':
      need(self.noise_multiplier in (None, 0.0),
           '--noise_multiplier needs DP: set --dp=fixed|adaptive|per_layer_adaptive|joint')
    else:
      need(self.weighting == 'uniform',
           f'--dp={self.dp} requires uniform client weighting (--weighting=uniform): a client '
           'weighted by its example count could exceed the clip-based sensitivity')
      need(self.clip is not None,
           f'--dp={self.dp} needs --clip (the fixed clip, or the initial clip when adaptive): '
           'noise without a clip norm has no sensitivity to calibrate to')
      need(self.clip > 0, f'--clip must be positive, got {self.clip}')
      need(self.noise_multiplier is not None and self.noise_multiplier >= 0,
           f'--dp={self.dp} needs --noise_multiplier >= 0')
    need(self.precondition in ('none', 'client', 'server'),
         f'--precondition must be none, client or server, got {self.precondition!r}')
    need(self.train_on_aggregate in ('none', 'ema', 'past_k'),
         f'--train_on_aggregate must be none, ema or past_k, got {self.train_on_aggregate!r}')
    if self.train_on_aggregate == 'ema':
      need(self.ema_beta is not None, '--train_on_aggregate=ema needs --ema_beta')
    if self.train_on_aggregate == 'past_k':
      need(self.past_k >= 1, '--train_on_aggregate=past_k needs --past_k >= 1')
    if self.max_epsilon is not None:
      need(self.max_epsilon > 0, f'--max_epsilon must be positive, got {self.max_epsilon}')
      need(self.dp != 'none', '--max_epsilon needs DP (--dp != none)')
    if self.delta is not None:
      need(0 < self.delta < 1, f'--delta must be in (0, 1), got {self.delta}')
    for key, value in self.paper_results.items():
      need(isinstance(value, (int, float)) and not isinstance(value, bool)
           and math.isfinite(value),
           f'--paper_results: {key} must be a finite number, got {value!r}')


def build_aggregator(cfg: ExperimentConfig, model_weights_type=None):
  """The model-update aggregation factory for `cfg.dp` (None = TFF's default mean)."""
  if cfg.dp == 'none':
    return None
  from tff_dp import aggregators  # pylint: disable=g-import-not-at-top
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
  return aggregators.build_dp_aggregator(cfg.dp, **kwargs)


def _sampler(cfg: ExperimentConfig, client_ids):
  population = len(client_ids)
  if population == 0:
    raise UserInputError('the training data has no clients')
  if cfg.clients_per_round > population:
    raise UserInputError(f'--clients_per_round={cfg.clients_per_round} exceeds the '
                         f'{population} training clients')
  if cfg.client_sampling == 'poisson':
    return sampling.PoissonSampler(client_ids, cfg.clients_per_round / population, seed=cfg.seed)
  return sampling.FixedSizeSampler(client_ids, cfg.clients_per_round, seed=cfg.seed)


def _eval_dataset(task, max_examples: int, seed: int):
  # TFF shuffles the client order with an unseeded RNG unless given a seed: with
  # --max_eval_examples the evaluated subset would differ between runs (and across a resume).
  raw = task.test_data.create_tf_dataset_from_all_clients(seed=seed)
  if max_examples:
    raw = raw.take(max_examples)
  return task.preprocess_eval(raw)


def run(cfg: ExperimentConfig, task, *, log=print) -> dict[str, Any]:
  """Validates `cfg`, builds everything, and runs (or resumes) the experiment."""
  cfg.validate()
  run_dir = run_dir_lib.RunDirectory(cfg.root_output_dir, cfg.experiment_name, resume=cfg.resume)
  tf.keras.utils.set_random_seed(cfg.seed)

  train_ids = list(task.train_data.client_ids)
  if cfg.max_train_clients is not None:
    if cfg.max_train_clients > len(train_ids):
      raise UserInputError(f'--max_train_clients={cfg.max_train_clients} exceeds the '
                           f'{len(train_ids)} training clients')
    train_ids = train_ids[:cfg.max_train_clients]
  public_ids: list = []
  if cfg.precondition != 'none' and cfg.side_info == 'public_clients':
    # Held-out public/proxy clients (the paper's OOD setting): removed from the private population.
    public_ids, train_ids = train_ids[:cfg.num_public_clients], train_ids[cfg.num_public_clients:]
  sampler = _sampler(cfg, train_ids)

  client_optimizer = optimizers.build_optimizer(cfg.client_optimizer, cfg.client_learning_rate)
  server_optimizer = optimizers.build_optimizer(
      cfg.server_optimizer, cfg.server_learning_rate, momentum=cfg.server_momentum)
  aggregator = build_aggregator(cfg)
  if cfg.precondition != 'none':
    from tff_dp.adadps import wiring  # pylint: disable=g-import-not-at-top
    scales = wiring.scales_for_task(task, cfg.side_info, public_client_ids=public_ids,
                                    cap=cfg.precondition_cap,
                                    division=cfg.precondition_division, eps=cfg.precondition_eps,
                                    preconditioner=cfg.preconditioner,
                                    num_frequent=cfg.precondition_num_frequent,
                                    rare_scale=cfg.precondition_rare_scale)
    if cfg.precondition == 'client':
      client_optimizer = wiring.client_optimizer(cfg.client_optimizer, cfg.client_learning_rate,
                                                 scales)
    else:
      aggregator = wiring.server_aggregator(scales, aggregator)

  if cfg.weighting == 'uniform':
    # Outermost: a NaN/Inf client update is zeroed before any clipping or preconditioning.
    from tff_dp.aggregators import non_finite  # pylint: disable=g-import-not-at-top
    aggregator = non_finite.NonFiniteZeroingFactory(
        aggregator if aggregator is not None else tff.aggregators.UnweightedMeanFactory())
    process = tff.learning.algorithms.build_unweighted_fed_avg(
        task.model_fn, client_optimizer_fn=client_optimizer,
        server_optimizer_fn=server_optimizer, model_aggregator=aggregator)
  else:
    process = tff.learning.algorithms.build_weighted_fed_avg(
        task.model_fn, client_optimizer_fn=client_optimizer,
        server_optimizer_fn=server_optimizer)

  # Built after the process: TFF traces model_fn inside a tf.compat.v1.Graph, which invalidates
  # Keras models created before it ("Your Layer or Model is in an invalid state").
  evaluator = evaluation.CentralizedEvaluator(
      task.keras_model_fn, task.loss_fn, task.metrics_fn,
      _eval_dataset(task, cfg.max_eval_examples, cfg.seed))
  # Integer labels/tokens must index the model's outputs (checked once per client).
  max_index = evaluator.output_dim
  aggregates, train_policy = _checkpoint_aggregation(cfg)
  delta = cfg.delta if cfg.delta is not None else _default_delta(len(train_ids))

  run_dir.create()
  run_dir.write_config(dict(dataclasses.asdict(cfg), delta_used=delta,
                            population_size=len(train_ids), task=task.name))
  ledger = accountant = None
  if cfg.dp != 'none':
    from tff_dp import accounting  # pylint: disable=g-import-not-at-top
    # On resume, a partial last line is a record whose round released nothing (outputs are
    # released only after the append completes): it is moved aside, never silently dropped.
    ledger = ledger_lib.PrivacyLedger(run_dir.file('ledger.jsonl'), repair=cfg.resume)
    if ledger.repaired_to:
      log(f'ledger: partial last line from a crash moved to {ledger.repaired_to}')
    # PLD at a 1e-3 value grid: dp_accounting discretizes pessimistically (a valid upper
    # bound), measured equal to the 1e-4 grid to 8 digits here and 10x faster per round; the
    # post-hoc `python -m tff_dp.accounting` replays the ledger at the finer default.
    accountant = accounting.LedgerAccountant(
        delta=delta, methods=tuple(cfg.accounting), pld_every=cfg.pld_every,
        pld_value_discretization_interval=1e-3)

  components = loop.LoopComponents(
      process=process, run_dir=run_dir, sampler=sampler,
      client_dataset_fn=lambda cid: task.preprocess_train(
          task.train_data.create_tf_dataset_for_client(cid)),
      evaluator=evaluator, ledger=ledger, accountant=accountant,
      aggregates=aggregates, train_on_aggregate=train_policy, log=log,
      check_client_fn=lambda ds: client_data.check_client_dataset(ds, max_index))
  loop_config = loop.LoopConfig(
      total_rounds=cfg.total_rounds, rounds_per_eval=cfg.rounds_per_eval,
      rounds_per_checkpoint=cfg.rounds_per_checkpoint, delta=delta,
      max_epsilon=cfg.max_epsilon, uncertainty_last_k=cfg.uncertainty_last_k,
      dp_enabled=cfg.dp != 'none', client_cache_size=cfg.client_cache_size,
      prefetch_clients=cfg.prefetch_clients)
  log(f'run directory: {run_dir.path}  (population {len(train_ids)}, '
      f'{cfg.client_sampling} sampling, delta {delta:g})')
  summary = loop.run_training(loop_config, components)
  summary['run_dir'] = run_dir.path
  return summary


def _default_delta(population: int) -> float:
  """delta below 1/population, the usual requirement for user-level DP."""
  return min(1e-5, 10 ** math.floor(math.log10(1.0 / population) - 1))


def _checkpoint_aggregation(cfg: ExperimentConfig):
  aggregates = {}
  policy = None
  if cfg.ema_beta is None and not cfg.past_k and cfg.train_on_aggregate == 'none':
    return aggregates, policy
  from tff_dp import checkpoint_aggregation as ca  # pylint: disable=g-import-not-at-top
  if cfg.ema_beta is not None:
    aggregates['ema'] = ca.EMAAggregate(cfg.ema_beta)
  if cfg.past_k:
    aggregates['past_k'] = ca.PastKAverage(cfg.past_k)
  if cfg.train_on_aggregate != 'none':
    policy = ca.TrainOnAggregate(cfg.train_on_aggregate, start_round=cfg.aggregate_start_round)
  return aggregates, policy
