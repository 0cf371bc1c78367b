"""The privacy part of an experiment, from its typed config sections: the sampler, the DP
aggregation factory, the delta, the accountant, and (once the run directory exists) the ledger
and the recorder the loop drives.

Nothing here branches on a mechanism's name: what differs between mechanisms is what each
declares (`tff_dp.mechanisms`: its kind of noise, its settings; tree aggregation restarts per
epoch, correlated noise plans its strategy for the run's schedule).
"""

import dataclasses
import math
from typing import Any, Mapping, Optional

from tff_dp import accounting
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp import run_format
from tff_dp import sampling
from tff_dp.accounting import guarantee
from tff_dp.aggregators import noise_feed
from tff_dp.aggregators import privacy_queries as privacy_queries_lib
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib
from tff_dp.training import population as population_lib
from tff_dp.training.run_state import privacy_recorder

# The run's secrets, kept in its secret/ folder (`tff_dp.run_format`): the permutation
# samplers' key (for resume), the population's digest (a resume on another population is
# refused), the key of the ledger's MACs (`ledger.new_mac_key`) and the ledger's seal.
SAMPLING_KEY_FILE = run_format.SAMPLING_KEY_FILE
POPULATION_FILE = run_format.POPULATION_DIGEST_FILE
LEDGER_KEY_FILE = run_format.LEDGER_KEY_FILE
LEDGER_SEAL_FILE = run_format.LEDGER_SEAL_FILE


@dataclasses.dataclass
class Privacy:
  """What the privacy sections build before anything is written."""
  sampler: Any
  dp_factory: Any                # The DP aggregation factory (None without DP).
  delta: float
  accountant: Any                # tff_dp.accounting.LedgerAccountant, or None without DP.
  tree: bool                     # Tree aggregation (DP-FTRL): leaf 1 in round 1.
  key_to_save: Optional[bytes]   # A new secret shuffling key (saved once the run dir exists).
  # The strategy of correlated noise (dp=blt|bandmf), recorded with every round.
  correlated: Optional[ledger_lib.CorrelatedNoise] = None
  # A noise-cohort simulation's projected production run (`noise_cohort_size`), else None.
  projection: Optional[privacy_recorder.Projection] = None
  # The population's digest to keep under secret/ (a new run, or one recorded before digests).
  population_to_save: Optional[bytes] = None
  # The ledger's MAC key (None: a run recorded before MACs), and a new one to keep.
  ledger_key: Optional[bytes] = None
  ledger_key_to_save: Optional[bytes] = None
  # The noise family every record names (`NoiseFamily.recorded_name`), else None.
  recorded_noise: Optional[str] = None
  # Whether checkpoints hold the mechanism's noise state (`NoiseFamily.carries_state`: the
  # tree's, in the aggregator's state; correlated noise's feed, its seed and buffers): then
  # checkpoints are secrets.
  noise_state: bool = False


def build_aggregator(dp: config_lib.DPConfig, clients_per_round: int,
                     rounds_per_epoch: Optional[int] = None, total_rounds: int = 0,
                     amplified: bool = False, noise_scale: float = 1.0,
                     mechanism_settings: Optional[Mapping[str, Any]] = None):
  """The model-update aggregation factory for `dp.kind` (None = TFF's default mean), with the
  mechanism's own settings (`mechanism_settings`, by flat name; unset: the factory's defaults).

  `rounds_per_epoch`: the tree factories restart after every epoch of the shuffled sampler;
  for correlated noise, the sampler's cycle (`NoiseFamily.schedule`). `amplified`: the sampler
  is cyclic Poisson (amplified BandMF). `noise_scale`: what every query's noise is multiplied
  by (a noise cohort's m / M; the noise multiplier and clipped-count stddev the settings give
  are the production run's)."""
  if dp.kind == 'none':
    return None
  adaptive = dp.adaptive_clipping
  if noise_scale != 1.0 and adaptive.clipped_count_stddev is not None:
    adaptive = dataclasses.replace(
        adaptive, clipped_count_stddev=adaptive.clipped_count_stddev * noise_scale)
  mechanism = mechanisms.get(dp.kind)
  own = dict(mechanism_settings or {})
  # The options that follow the sampler's schedule (the tree's epoch, a strategy's plan), then
  # the mechanism's own settings that have a value (`restart_warmup`, ...).
  options = mechanism.noise.schedule(rounds_per_epoch, total_rounds, own, amplified)
  options.update({name: value for name, value in own.items()
                  if name not in options and value is not None
                  and name in (mechanism.extra_arguments or ())})
  return mechanisms.build_aggregator(
      dp.kind, noise_multiplier=float(dp.noise_multiplier) * noise_scale,
      clients_per_round=float(clients_per_round), clip=float(dp.clip),
      adaptive=adaptive, noise_allocation=dp.noise_allocation, **options)


def _sampler(cfg: config_lib.SamplingConfig, client_ids, key_path: str, resume: bool,
             groups: Optional[int]):
  """The configured sampler (`groups`: cyclic Poisson's); a permutation sampler's secret key is
  read from `key_path` on resume (a new key mid-epoch would let clients participate twice in
  the epoch)."""
  population_lib.check_sample_size(cfg.clients_per_round, len(client_ids))
  key = None
  if sampling.get(cfg.client_sampling).keyed and cfg.sampling_seed is None:
    key = sampling.load_key(key_path)
    if key is None and resume:
      raise UserInputError(f'`resume`: {key_path} is missing; without the shuffling key the '
                           'epochs cannot be continued (clients could participate twice)')
  return sampling.build_sampler(
      cfg.client_sampling, client_ids, cfg.clients_per_round, seed=cfg.sampling_seed, key=key,
      groups=groups, probability=cfg.sampling_probability)


def _check_population(population: list, digest_path: str, resume: bool,
                      recorded_size: Optional[int], permutation: bool) -> Optional[bytes]:
  """The population's digest to keep (None: the recorded one stands), after refusing a resume
  on another population than the recorded one: samplers key their draws on client ids, so
  other clients would get another schedule mid-run (clients in consecutive rounds of a
  min-separation plan) and the ledger's claim would not hold."""
  digest = sampling.population_digest(population)
  if not resume:
    return digest
  recorded = sampling.load_key(digest_path, what='population digest')
  if recorded is None:
    if permutation:
      raise UserInputError(
          f'`resume`: {digest_path} is missing: the run was made before samplers keyed client '
          'ids, and its schedule cannot be continued (clients could participate twice); start '
          'a new run')
    return digest
  if recorded != digest:
    raise UserInputError(
        f'`resume`: the training population is not the one this run sampled '
        f'({recorded_size} clients recorded, {len(population)} now, or other ids): its '
        'schedule and privacy claim hold for one population; resume on the same data')
  return None


def _accountant(accounting_cfg: config_lib.AccountingConfig, delta: float, relation: str):
  # `relation`: the claim's (`accounting.claims`), the one its proof supports.
  # PLD at a 1e-3 value grid: dp_accounting discretizes pessimistically (a valid upper
  # bound), measured equal to the 1e-4 grid to 8 digits here and 10x faster per round; the
  # post-hoc `python -m tff_dp.accounting` replays the ledger at the finer default.
  return accounting.LedgerAccountant(
      delta=delta, methods=tuple(accounting_cfg.methods), pld_every=accounting_cfg.pld_every,
      pld_value_discretization_interval=1e-3,
      neighboring_relation=relation)


def _projection(cohort, accounting_cfg: config_lib.AccountingConfig, relation: str):
  """The projected production run of a noise cohort: its accountant at the configured delta,
  or by default the one suggested for the production population."""
  population = cohort.population
  delta = accounting.check_delta(
      accounting_cfg.delta if accounting_cfg.delta is not None
      else accounting.suggested_delta(population), population)
  return privacy_recorder.Projection(cohort, _accountant(accounting_cfg, delta, relation),
                                     delta)


def build(sampling_cfg: config_lib.SamplingConfig, dp: config_lib.DPConfig,
          accounting_cfg: config_lib.AccountingConfig, population: list, key_path: str,
          resume: bool, total_rounds: int, cohort=None, population_path: Optional[str] = None,
          recorded_population: Optional[int] = None,
          ledger_key_path: Optional[str] = None,
          mechanism_settings: Optional[Mapping[str, Any]] = None) -> Privacy:
  """The sampler over `population`, the DP factory, delta and the accountant
  (`mechanism_settings`: the mechanism's own, `ExperimentConfig.mechanism_settings()`);
  `cohort`: a noise-cohort simulation (`noise_cohort.NoiseCohort`) and its projection;
  `population_path`: where the population's digest is kept (None: not checked), and
  `recorded_population` the size config.json recorded (for the message); `ledger_key_path`:
  where the ledger's MAC key is kept (None: no MACs)."""
  digest = None
  if population_path is not None:
    digest = _check_population(
        population, population_path, resume, recorded_population,
        sampling.get(sampling_cfg.client_sampling).keyed)
  own = dict(mechanism_settings or {})
  cyclic = sampling.get(sampling_cfg.client_sampling).grouped
  sampler = _sampler(sampling_cfg, population, key_path, resume,
                     own.get('bands') if cyclic else None)
  mechanism = mechanisms.find(dp.kind)
  tree = mechanism is not None and mechanism.noise.records_tree_leaf
  delta = accounting.check_delta(
      accounting_cfg.delta if accounting_cfg.delta is not None
      else accounting.suggested_delta(len(population)), len(population))
  relation = None
  if mechanism is not None:
    relation = mechanisms.claim(dp.kind, sampling_cfg.client_sampling,
                                sampling_cfg.sampling_probability is not None).columns_relation
  accountant = _accountant(accounting_cfg, delta, relation) if relation else None
  dp_factory = build_aggregator(dp, sampling_cfg.clients_per_round,
                                sampler.rounds_per_epoch, total_rounds,
                                amplified=cyclic,
                                noise_scale=cohort.scale if cohort is not None else 1.0,
                                mechanism_settings=own)
  ledger_key = new_ledger_key = None
  if ledger_key_path is not None and mechanism is not None:
    if resume:   # A run recorded before MACs has no key, and goes on without.
      ledger_key = sampling.load_key(ledger_key_path, what='ledger key')
    else:
      ledger_key = new_ledger_key = ledger_lib.new_mac_key()
  new_key = sampler.key is not None and sampler.secret and not resume
  return Privacy(sampler=sampler, dp_factory=dp_factory, delta=delta, accountant=accountant,
                 tree=tree, key_to_save=sampler.key if new_key else None,
                 correlated=getattr(dp_factory, 'strategy', None),
                 projection=(_projection(cohort, accounting_cfg, relation) if cohort is not None
                             else None),
                 population_to_save=digest, ledger_key=ledger_key,
                 ledger_key_to_save=new_ledger_key,
                 recorded_noise=mechanism.noise.recorded_name if mechanism else None,
                 noise_state=mechanism is not None and mechanism.noise.carries_state)


def available_memory_bytes() -> Optional[int]:
  """MemAvailable of /proc/meminfo (None where there is none)."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def check_noise_memory(dp_factory, trainable_shapes, available: Optional[int]) -> None:
  """Refuses a correlated-noise strategy whose noise state (`num_buffers` model copies, kept
  by the coordinator's noise feed) would take more than half of `available` bytes."""
  copies = getattr(dp_factory, 'num_buffers', 0)
  if not copies or available is None:
    return
  need = copies * 4 * sum(math.prod(s) for s in trainable_shapes)
  if need > available / 2:
    kind = dp_factory.strategy.mechanism
    fewer = [n for n in mechanisms.with_noise(mechanisms.get(kind).noise)
             if n not in mechanisms.with_setting('bands')]
    instead = (f'`dp={"|".join(fewer)}` (a few buffers) or fewer `bands`'
               if dp_factory.strategy.bands else 'a smaller model')
    raise UserInputError(
        f'`dp={kind}` keeps {copies} model copies of noise state ({need / 2**30:.2f} GiB) '
        f'with {available / 2**30:.2f} GiB available; use '
        f'{instead}')


def first_round_queries(process) -> tuple[ledger_lib.GaussianSumQuery, ...]:
  """The Gaussian sum queries round 1 will execute, read from a round run on no client.

  The learning process runs one round on zero clients from its initial state (no client data
  is touched, so this costs no privacy; the result is discarded): the aggregator reports the
  (clip, noise stddev) tuples of its pre-round state exactly as it will in round 1.
  """
  state = process.initialize()
  if noise_feed.holds_fed_noise(state):   # Zeros: this round's output is discarded.
    state = noise_feed.with_zero_noise(state)
  output = process.next(state, [])
  return tuple(privacy_queries_lib.find_privacy_queries(output.metrics['aggregator']))


def planned_queries(privacy: Privacy, process, max_epsilon: Optional[float],
                    resume: bool) -> tuple:
  """The queries round 1 will execute when `max_epsilon` is set (else ()); refuses a new run
  whose first round alone would exceed it."""
  if max_epsilon is None:
    return ()
  planned = first_round_queries(process)
  if not resume:
    first = guarantee.predicted([], ledger_lib.RoundRecord(
        1, privacy.sampler.sampling_event(1), planned, 1 if privacy.tree else None,
        privacy.correlated, privacy.recorded_noise), privacy.accountant)
    if first > max_epsilon:
      raise UserInputError(
          f'`max_epsilon={max_epsilon:g}`: the first round alone would reach epsilon '
          f'{first:.4g} at delta {privacy.delta:g}; raise `max_epsilon` or `noise_multiplier` '
          '(nothing was written)')
  return planned


def recorder(privacy: Privacy, ledger_path: str, planned: tuple, resume: bool, log,
             seal_path: Optional[str] = None):
  """The loop's privacy recorder, with the ledger opened at `ledger_path` (the run directory
  exists), sealed at `seal_path` when the ledger is MAC'd; `NO_DP` without DP. On resume, a
  partial last line is a record whose round released nothing (outputs are released only after
  the append completes): it is moved aside, never silently dropped."""
  if privacy.accountant is None:
    return privacy_recorder.NO_DP
  ledger = ledger_lib.PrivacyLedger(
      ledger_path, repair=resume, mac_key=privacy.ledger_key,
      seal_path=seal_path if privacy.ledger_key is not None else None)
  if ledger.repaired_to:
    log(f'ledger: partial last line from a crash moved to {ledger.repaired_to}')
  return privacy_recorder.PrivacyRecorder(
      ledger=ledger, accountant=privacy.accountant, sampler=privacy.sampler,
      planned_queries=planned, planned_tree_leaf=1 if privacy.tree else None,
      correlated=privacy.correlated, noise=privacy.recorded_noise,
      projection=privacy.projection)
