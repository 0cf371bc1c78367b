# Longer than 350 lines: every setting of a run is declared here once (about 85, with type,
# default, help and checks); flags, checks, config.json and docs/FLAGS.md derive from them.
"""The library's config sections: one frozen, keyword-only dataclass per concern (task and data,
sampling, training, dp, accounting, adadps, checkpoint_aggregation, canaries, runtime, output,
paper), one field per setting, each declared once with its type, default, help and checks
(`tff_dp.sections.setting`), and each section's own rules between its fields.

`tff_dp.training.config.ExperimentConfig` holds one of each (and the plug-ins' sections) and
checks the rules between sections. Lists of allowed values come from their one home
(`tff_dp.choices`, the mechanisms' and the tasks' registries). No TensorFlow.
"""

import dataclasses
import math
import os
from typing import Mapping, Optional

from tff_dp import adaptive_clipping
from tff_dp import choices
from tff_dp import mechanisms
from tff_dp import sampling
from tff_dp import sections
from tff_dp.errors import UserInputError
from tff_dp.execution import worker_addresses
from tff_dp.sections import Section
from tff_dp.sections import setting
from tff_dp.training import task_registry

_at_least = sections.at_least
_POSITIVE = sections.POSITIVE
_NON_NEGATIVE = sections.NON_NEGATIVE


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskConfig(Section):
  """Task and data: which task, where its data is, how each client's data is batched."""
  name: str = setting('emnist', 'Task to train: a registered task (the command line registers '
                      'the repository\'s; checked when the run builds it).',
                      flag='task', named_in=task_registry.CHOICES)
  data_dir: Optional[str] = setting(
      None, 'TFF dataset cache directory (holding e.g. emnist_all.sqlite or '
      'stackoverflow.sqlite, as written by tff.simulation.datasets.*.load_data). Unset: use '
      'the embedded synthetic dataset (generated deterministically into `embedded_data_dir`; '
      'no download).', path=True)
  embedded_data_dir: str = setting(
      task_registry.DEFAULT_EMBEDDED_DATA_DIR,
      'Where the embedded default dataset is generated when `data_dir` is unset.', path=True)
  client_batch_size: int = setting(20, 'Local batch size.', check=_at_least(1))
  client_epochs_per_round: int = setting(
      1, 'Local epochs each client runs per round.', check=_at_least(1))
  max_elements_per_client: Optional[int] = setting(
      None, 'Cap on examples each client uses per round (after repeating epochs); unset: all.',
      check=_at_least(1))
  max_train_clients: Optional[int] = setting(
      None, 'Train on only the first N training clients in the dataset\'s client order (e.g. '
      'the 400-client StackOverflow subset of the AdaDPS federated experiment); unset: all '
      'clients.', check=(lambda v: v >= 1, 'must be >= 1 when set'))

  def _check(self):
    if (self.data_dir is not None
        and self.embedded_data_dir != task_registry.DEFAULT_EMBEDDED_DATA_DIR):
      raise UserInputError('`embedded_data_dir` is where the embedded dataset is generated '
                           'when `data_dir` is unset; with `data_dir` it is not used: drop one')


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig(Section):
  """Which clients train in each round."""
  clients_per_round: int = setting(
      10, 'Clients per round: the sample size (fixed_size) or its expectation (poisson).',
      check=(lambda v: v >= 1, 'must be a positive integer'))
  client_sampling: str = setting(
      'poisson', 'How clients are drawn each round.', one_of=mechanisms.SAMPLER_CHOICES)
  sampling_seed: Optional[int] = setting(
      None, 'Make client sampling reproducible from this seed (simulations, tests). Unset: '
      'each round\'s sample is drawn from OS randomness and is secret, as the accountant\'s '
      'amplification by sampling assumes. When set, the privacy statement says the samples '
      'are known to whoever holds the seed.',
      check=(lambda v: 0 <= v < 2**63, 'must be in [0, 2^63) when set'))
  sampling_probability: Optional[float] = setting(
      None, 'poisson and cyclic_poisson: the rate q at which each client (of its group) is '
      'included, fixed before the data is seen and used whatever the population size, so '
      'the privacy claim is add/remove-one; `clients_per_round` stays the mean\'s '
      'denominator. Unset: q is derived from the population (clients_per_round / N, times '
      '`bands` for cyclic_poisson), and the claim is zero-out, whose neighbours share the '
      'population (the same epsilon).',
      check=(lambda v: 0 < v <= 1, 'must be in (0, 1] when set'))

  def _check(self):
    if (self.sampling_probability is not None
        and self.client_sampling not in sampling.with_rate()):
      raise UserInputError(
          f'`sampling_probability` is the rate of {choices.one_of(sampling.with_rate())} '
          f'sampling; `client_sampling={self.client_sampling}` draws `clients_per_round` '
          'clients a round')


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingConfig(Section):
  """Rounds, seeding, weighting and the client and server optimisers."""
  total_rounds: int = setting(20, 'Number of training rounds.', check=_at_least(1),
                              resumable=True)
  seed: int = setting(
      0, 'Seed for model initialisation, client data order and the eval subset (never for '
      'client sampling or DP noise, which are secret).',
      check=(lambda v: 0 <= v < 2**32, 'must be in [0, 2^32)'))
  weighting: str = setting(
      'uniform', 'Client weighting in the average. DP requires uniform (each user contributes '
      'equally).', one_of=choices.WEIGHTINGS)
  client_optimizer: str = setting('sgd', 'Client (local) optimizer.', one_of=choices.OPTIMIZERS)
  client_learning_rate: float = setting(0.1, 'Client learning rate.', check=_POSITIVE)
  server_optimizer: str = setting(
      'sgd', 'Server optimizer applied to the (noised) average update.',
      one_of=choices.OPTIMIZERS)
  server_learning_rate: float = setting(1.0, 'Server learning rate.', check=_POSITIVE)
  server_momentum: float = setting(
      0.9, 'Server momentum (sgd only; 0 disables).',
      check=(lambda v: 0 <= v < 1, 'must be in [0, 1)'))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DPConfig(Section):
  """Differential privacy: how client updates are clipped and noised."""
  kind: str = setting('adaptive', 'DP aggregation.', flag='dp', one_of=mechanisms.DP_KINDS)
  clip: Optional[float] = setting(
      None, 'L2 clip norm of each client update (the initial clip when adaptive).',
      check=_POSITIVE)
  noise_multiplier: Optional[float] = setting(
      None, 'Effective noise multiplier z (noise stddev / sensitivity of the whole round). '
      'With adaptive clipping part of it is spent on the clipped-count query.',
      check=(lambda v: v >= 0, 'must be >= 0'))
  target_unclipped_quantile: float = setting(
      0.5, 'Adaptive clipping: target quantile gamma of update norms.',
      check=(lambda v: 0 < v < 1, 'must be in (0, 1)'))
  clip_learning_rate: float = setting(
      0.2, 'Adaptive clipping: learning rate eta_C of the clip update.', check=_POSITIVE)
  clip_update_rule: str = setting(
      'geometric', 'Adaptive clipping: how the clip follows the noised unclipped fraction b.',
      one_of=choices.CLIP_UPDATE_RULES)
  clipped_count_stddev: Optional[float] = setting(
      None, 'Adaptive clipping: noise stddev sigma_b of the clipped-count sum (default '
      'clients_per_round / 20, as recommended in Andrew et al., or `noise_multiplier` when that '
      'is larger: below noise_multiplier / 2 the count would spend the whole noise budget).',
      check=(lambda v: v >= 0, 'must be >= 0 when set'))
  noise_allocation: str = setting(
      'proportional', 'Per-layer/joint: how the noise budget is split across groups (ledger '
      'paper, Sec. 4).', one_of=choices.NOISE_ALLOCATIONS)
  noise_cohort_size: Optional[int] = setting(
      None, 'Simulate production noise: train `clients_per_round` clients but add the noise of '
      'a cohort of this many (every query\'s noise scaled by clients_per_round / this), and '
      'report the epsilon of a production run of this many clients per round from '
      '`noise_population` as a projection. This run\'s own clients are protected only at its '
      'own, much larger, epsilon.', check=_at_least(1))
  noise_population: Optional[int] = setting(
      None, '`noise_cohort_size`: the production population the projected epsilon samples '
      'from.', check=_at_least(1))

  @property
  def adaptive_clipping(self) -> adaptive_clipping.AdaptiveClipping:
    """How an adaptive clip follows the update norms (the settings' one type)."""
    return adaptive_clipping.AdaptiveClipping(
        target_unclipped_quantile=self.target_unclipped_quantile,
        clip_learning_rate=self.clip_learning_rate, update_rule=self.clip_update_rule,
        clipped_count_stddev=self.clipped_count_stddev)

  def _check(self):
    if self.kind == mechanisms.NO_DP:
      if self.noise_multiplier not in (None, 0.0):
        raise UserInputError('`noise_multiplier` needs DP: set '
                             f'`dp={"|".join(mechanisms.MECHANISMS)}`')

  def check_complete(self) -> None:
    """Raises UserInputError unless DP has what it calibrates to (the clip and the noise).

    Checked by the whole config, after its sections' types, not when this section is built:
    the defaults (`dp=adaptive`, no clip) are a section a user completes, and a config built
    with a wrong section type should hear of the type first.
    """
    if self.kind == mechanisms.NO_DP:
      return
    if self.clip is None:
      raise UserInputError(
          f'`dp={self.kind}` needs `clip` (the fixed clip, or the initial clip when adaptive): '
          'noise without a clip norm has no sensitivity to calibrate to')
    if self.noise_multiplier is None:
      raise UserInputError(f'`dp={self.kind}` needs `noise_multiplier` >= 0')


def _distinct_accountants(methods) -> bool:
  return (bool(methods) and all(m in choices.ACCOUNTANTS for m in methods)
          and len(set(methods)) == len(methods))


@dataclasses.dataclass(frozen=True, kw_only=True)
class AccountingConfig(Section):
  """Privacy accounting: the reported epsilon, and the cap that stops a run."""
  methods: tuple[str, ...] = setting(
      tuple(choices.ACCOUNTANTS), 'Accountants that report epsilon each round.',
      flag='accounting', resumable=True,
      check=(_distinct_accountants,
             f'must be a non-empty list of distinct {", ".join(choices.ACCOUNTANTS)}'))
  delta: Optional[float] = setting(
      None, 'Target delta for reported epsilon (default: < 1/population, at most 1e-5).',
      check=(lambda v: 0 < v < 1, 'must be in (0, 1)'))
  max_epsilon: Optional[float] = setting(
      None, 'Stop cleanly before the round that would push epsilon above this.',
      check=_POSITIVE, resumable=True)
  pld_every: int = setting(
      10, 'Report PLD epsilon every N rounds (a report costs ~0.02-0.5 s, more at small noise '
      'and, with adaptive clipping, whose noise multiplier changes every round; RDP is reported '
      'every round). Rerun `python -m tff_dp.accounting` on the ledger for a full PLD curve.',
      check=_at_least(1), resumable=True)


def _side_info_name(value: str) -> bool:
  return value in choices.SIDE_INFO or (value.startswith('file:') and len(value) > 5)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaDPSConfig(Section):
  """AdaDPS: preconditioning with public side information."""
  precondition: str = setting(
      'none', 'AdaDPS: where the preconditioner applies.', one_of=choices.PRECONDITION_SIDES)
  side_info: str = setting(
      'word_freq', 'AdaDPS side information (file:PATH: a .npy/.npz file).')
  preconditioner: str = setting(
      'auto', 'AdaDPS preconditioner built from the side information (rank: the AdaDPS '
      'federated code, 100 and 200).', one_of=choices.PRECONDITIONERS)
  precondition_cap: float = setting(
      1000.0, 'AdaDPS frequency preconditioner: cap on max(freq)/freq.', check=_POSITIVE)
  precondition_division: float = setting(
      1.0, 'AdaDPS frequency preconditioner: divisor of the scales.', check=_POSITIVE)
  precondition_eps: float = setting(
      1e-8, 'AdaDPS second-moment preconditioner: eps in 1/sqrt(v + eps).', check=_POSITIVE)
  precondition_num_frequent: int = setting(
      100, 'AdaDPS rank preconditioner: tokens left unscaled.', check=_NON_NEGATIVE)
  precondition_rare_scale: float = setting(
      200.0, 'AdaDPS rank preconditioner: scale of the other tokens.', check=_POSITIVE)
  num_public_clients: int = setting(
      10, 'AdaDPS public_clients: first N clients held out from training as public data.',
      check=_at_least(1))

  def _check(self):
    if self.precondition != 'none' and not _side_info_name(self.side_info):
      raise UserInputError(f'`side_info` must be one of {choices.one_of(choices.SIDE_INFO)}, '
                           f'got {self.side_info!r}')


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointAggregationConfig(Section):
  """Checkpoint aggregation (Recycling Scraps): EMA / past-k models, last-k uncertainty."""
  ema_beta: Optional[float] = setting(
      None, 'Evaluate an EMA of server models with this beta (unset: off).',
      check=(lambda v: 0 <= v < 1, 'must be in [0, 1) when set'))
  past_k: int = setting(
      0, 'Evaluate the uniform average of the last k server models (0: off).',
      check=_NON_NEGATIVE)
  train_on_aggregate: str = setting(
      'none', 'Start each round from this aggregate instead of the last iterate (Algorithm 1).',
      one_of=choices.TRAIN_ON_AGGREGATE)
  aggregate_start_round: int = setting(
      0, 'Round tau after which training starts from the aggregate.', check=_NON_NEGATIVE)
  uncertainty_last_k: int = setting(
      0, 'Write uncertainty.json: variance of test accuracy and prediction scores over the '
      'last k checkpoints (0: off).',
      check=(lambda v: v == 0 or v >= 2,
             'must be 0 (off) or >= 2 (a spread needs two checkpoints)'))

  def _check(self):
    if self.train_on_aggregate == 'ema' and self.ema_beta is None:
      raise UserInputError('`train_on_aggregate=ema` needs `ema_beta`')
    if self.train_on_aggregate == 'past_k' and self.past_k < 1:
      raise UserInputError('`train_on_aggregate=past_k` needs `past_k` >= 1')


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeConfig(Section):
  """Execution: workers, concurrency, client-data caching. Same results; all may change on
  resume."""
  workers: Optional[str] = setting(
      None, 'Spread each round\'s clients over TFF workers at host:port,host:port,... (start '
      'one per host with `python -m tff_dp.worker --port N`). Unset: one local TFF worker.',
      resumable=True)
  worker_unavailable_timeout: float = setting(
      60.0, 'With `workers`: seconds a worker may be unreachable before the round fails (TFF '
      'alone would retry forever). The run then stops cleanly; `resume` continues.',
      check=_POSITIVE, resumable=True)
  worker_rpc_timeout: Optional[float] = setting(
      None, 'With `workers`: deadline in seconds of each call to a worker (bounds a hung '
      'worker; must exceed the longest client training call). Unset: none.', check=_POSITIVE,
      resumable=True)
  max_concurrent_computation_calls: int = setting(
      -1, 'Clients the TFF C++ worker trains concurrently (<= 0: all of a round\'s clients at '
      'once, TFF\'s default and the fastest; a cap bounds memory with many clients per round).',
      resumable=True)
  client_slices: int = setting(
      1, 'Run a round\'s clients in this many slices, one after the other, on the local TFF '
      'worker (TFF\'s mergeable context). The worker holds all clients\' updates of a call '
      'until their sum (~75 MiB per StackOverflow-tag client), so slices bound its peak '
      'memory; same results up to float summation order. Not with `workers`.',
      check=_at_least(1), resumable=True)
  worker_restart_rounds: int = setting(
      100, 'Replace the local TFF worker by a fresh process after every N-th round (0: never). '
      'Bounds the worker\'s memory over long runs (its heap fragments: ~0.3-0.5 MiB per '
      'round); same results, one worker start per restart. No effect with `workers`.',
      check=_NON_NEGATIVE, resumable=True)
  native_logs: bool = setting(
      False, 'Show the log lines of TensorFlow\'s, gRPC\'s and absl\'s C++ loggers on stderr '
      '(INFO, WARNING and ERROR records such as grappler\'s). Off: the run holds them back '
      'while it lasts, so the console carries the run\'s own lines.', resumable=True)
  client_cache_size: int = setting(
      1000, 'Preprocessed client datasets kept in memory across rounds (LRU; 0: rebuild every '
      'time).', check=_NON_NEGATIVE, resumable=True)
  prefetch_clients: bool = setting(
      True, 'Build the next round\'s client datasets in a background thread while a round '
      'runs.', resumable=True)
  loop_implementation: str = setting(
      'dataset_iterator', 'How TFF runs a client\'s pass over its batches. Same steps, same '
      'model.', one_of=choices.LOOP_IMPLEMENTATIONS, resumable=True)
  datasets_on_workers: bool = setting(
      False, 'Build each sampled client\'s dataset on the TFF worker from its client id (TFF\'s '
      'dataset computation composed into the learning process): a round sends ids instead of '
      'serialized datasets. Every worker must have the task\'s data at the same `data_dir` '
      'path. Same results; the coordinator still reads each new client once to check its '
      'data.', resumable=True)

  def _check(self):
    if self.workers is not None:
      worker_addresses.parse_workers(self.workers)   # Before TF: the format alone.
    if self.client_slices > 1 and self.workers:
      raise UserInputError('`client_slices` is for the local worker; with `workers` each '
                           'worker already runs its own slice')


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputConfig(Section):
  """Where the run is written, and how often it evaluates and checkpoints."""
  root_output_dir: str = setting('runs', 'Root of run directories.', path=True,
                                 check=(bool, 'must name a directory (empty: the current one '
                                        'would be written into)'), resumable=True)
  experiment_name: Optional[str] = setting(
      None, 'Run directory name (default: TASK-DP-TIMESTAMP).',
      check=(lambda v: bool(v) and os.sep not in v and v not in ('.', '..'),
             'must be a plain non-empty name'), resumable=True)
  resume: bool = setting(
      False, 'Continue the run in ROOT_OUTPUT_DIR/EXPERIMENT_NAME from its checkpoint, with the '
      'settings its config.json recorded (flags given with it override those a resume may '
      'change).')
  rerun_released_rounds: bool = setting(
      False, 'With `resume`: re-execute the rounds a run released after its last remaining '
      'checkpoint (its checkpoints were removed). Each is charged to the ledger again, and the '
      'console says how many; without it such a resume is refused. Independent noise only. '
      'Holds for the resume it is given to (never read from config.json).')
  rounds_per_eval: int = setting(1, 'Evaluate every N rounds.', check=_at_least(1),
                                 resumable=True)
  rounds_per_checkpoint: Optional[int] = setting(
      None, 'Checkpoint every N rounds (unset: 1 for DP-FTRL, whose accounting cannot cover a '
      're-executed round, else 10). Orderly stops checkpoint the last round anyway; after a '
      'crash, rounds after the last checkpoint that had released metrics are re-executed and '
      'counted again in the ledger. 1: exact resume, at ~0.3 s per round for the SavedModel '
      'write.', check=_at_least(1), resumable=True)
  max_eval_examples: int = setting(
      2000, 'Test examples used per evaluation (0: all).',
      check=(lambda v: v >= 0, 'must be >= 0 (0: all)'), resumable=True)
  eval_data: str = setting(
      'test', 'What central evaluation runs on; decides whether eval metrics are covered by '
      'the DP guarantee.', one_of=choices.EVAL_DATA)
  eval_holdout_clients: Optional[int] = setting(
      None, 'With `eval_data=holdout`: how many of the training clients that have test data '
      'to hold out for evaluation (unset: a tenth of them, at most 1000).', check=_at_least(1))
  private_release: bool = setting(
      False, 'Keep every non-private diagnostic (sampled and rejected client counts, client '
      'names, zeroed updates, timings, client training metrics, evaluation on protected users) '
      'out of the console, metrics.csv and plots, write no TensorBoard events (wall-clock '
      'times), and write release/: the final model, covered metrics, ledger and privacy '
      'statement, to publish as it is.')

  def _check(self):
    if self.rerun_released_rounds and not self.resume:
      raise UserInputError('`rerun_released_rounds` applies to a `resume` only: a new run '
                           'has no released rounds')
    if self.eval_holdout_clients is not None and self.eval_data != 'holdout':
      raise UserInputError('`eval_holdout_clients` is the size of the held-out evaluation set '
                           f'of `eval_data=holdout`, not of `eval_data={self.eval_data}`; give '
                           '`eval_data=holdout` or drop it')


def _finite_numbers(results: Mapping) -> bool:
  return all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
             and math.isfinite(v) for k, v in results.items())


@dataclasses.dataclass(frozen=True, kw_only=True)
class PaperConfig(Section):
  """What the run reproduces: recorded in config.json and read by `python -m tff_dp.tables`."""
  paper_table: str = setting(
      '', 'Paper table this run reproduces, e.g. "Andrew et al. 2021, Table 2" (set by the '
      'flag files in experiments/).', resumable=True)
  paper_arm: str = setting(
      '', 'Row/arm of `paper_table` this run reproduces, e.g. "adaptive, z=0.1".',
      resumable=True)
  paper_note: str = setting(
      '', 'Free-text remark on the paper\'s numbers, shown under the table.', resumable=True)
  paper_results: dict[str, float] = setting(
      default_factory=dict, help='The paper\'s numbers for this arm as key=value pairs: '
      'accuracy (or another eval metric name, e.g. ema_accuracy), epsilon, delta, rounds. '
      'Example: accuracy=0.83,epsilon=5,delta=1e-6',
      check=(_finite_numbers, 'must map names to finite numbers'), resumable=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CanaryConfig(Section):
  """Empirical privacy estimation with canary clients (Andrew et al., ICLR 2024)."""
  num_canaries: int = setting(
      0, 'Insert this many canary clients into the population: sampled like real clients '
      '(the population, q and the ledger count them), each sending its own secret random '
      'direction, which every clip cuts to the clip norm. 0: no canaries.',
      check=_NON_NEGATIVE)
  num_unseen_canaries: Optional[int] = setting(
      None, 'Canary directions drawn but never inserted: the fitted null of the all-iterates '
      'estimate. Unset: as many as `num_canaries`.', check=_NON_NEGATIVE)
  canary_inclusion: str = setting(
      'fixed', 'Which canaries are inserted (the others are held out, the null).',
      one_of=choices.CANARY_INCLUSIONS)
  canary_seed: Optional[int] = setting(
      None, 'Make the canary directions reproducible from this seed (tests). Unset: they come '
      'from a secret key kept beside the checkpoints, as the estimate assumes.',
      check=(lambda v: 0 <= v < 2**63, 'must be in [0, 2^63) when set'))

  def _check(self):
    if self.canary_seed is not None and not self.num_canaries:
      raise UserInputError('`canary_seed` seeds the canaries\' directions; without '
                           '`num_canaries` there is none: drop it or insert canaries')

  @property
  def unseen(self) -> int:
    """The number of unseen canaries (`num_unseen_canaries`, defaulting to `num_canaries`)."""
    return self.num_canaries if self.num_unseen_canaries is None else self.num_unseen_canaries


# The sections in the order the help and the documentation show them.
SECTIONS = {
    'task': TaskConfig, 'sampling': SamplingConfig, 'training': TrainingConfig,
    'dp': DPConfig, 'accounting': AccountingConfig, 'adadps': AdaDPSConfig,
    'checkpoint_aggregation': CheckpointAggregationConfig, 'canaries': CanaryConfig,
    'runtime': RuntimeConfig,
    'output': OutputConfig, 'paper': PaperConfig,
}
