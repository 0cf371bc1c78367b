"""Runs a user-level DP federated learning experiment (DP-FedAvg on TFF) from absl flags.

Example (the embedded default dataset, no download):
  python run_experiment.py --task=emnist --dp=adaptive --clip=0.1 --noise_multiplier=0.3

Outputs go to ROOT_OUTPUT_DIR/EXPERIMENT_NAME: metrics.csv (one row per round, epsilon included),
ledger.jsonl (privacy ledger), checkpoints/, tensorboard/, plots/*.png, config.json.
Bad input exits with code 2 and one line on stderr; an existing run directory is never touched
unless --resume is given.
"""

import os
import signal
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from tff_dp.training import stop_signal  # noqa: E402  (no TensorFlow: imported first)

# Installed before TensorFlow is imported, so that Ctrl-C or SIGTERM at any moment of start-up
# is seen (a KeyboardInterrupt raised inside TF's import or its gc callbacks can be swallowed)
# and ends the run with one line and exit code 128 + signal.
_STOP = stop_signal.StopSignal(print).install() if __name__ == '__main__' else None

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from absl import logging  # noqa: E402
# TensorFlow must be imported before `app.run`: when first imported inside an absl main, Keras
# fails to build any Sequential model with an input_shape (IndexError on `_inbound_nodes`).
import tensorflow as tf  # noqa: E402,F401  pylint: disable=unused-import

_TASKS = ('emnist', 'stackoverflow_word', 'stackoverflow_tag')

# Task and data.
_TASK = flags.DEFINE_string(
    'task', 'emnist', f'Task to train: one of {", ".join(_TASKS)}.')
_DATA_DIR = flags.DEFINE_string(
    'data_dir', None,
    'TFF dataset cache directory (holding e.g. emnist_all.sqlite or stackoverflow.sqlite, as '
    'written by tff.simulation.datasets.*.load_data). Unset: use the embedded synthetic dataset '
    '(generated deterministically into --embedded_data_dir; no download).')
_EMBEDDED_DATA_DIR = flags.DEFINE_string(
    'embedded_data_dir', os.path.join('data_cache', 'embedded'),
    'Where the embedded default dataset is generated when --data_dir is unset.')
_EMNIST_ONLY_DIGITS = flags.DEFINE_bool(
    'emnist_only_digits', False, 'EMNIST: 10 digit classes instead of all 62 characters.')
_SO_VOCAB_SIZE = flags.DEFINE_integer(
    'so_vocab_size', 10000, 'StackOverflow: word vocabulary size (most frequent words).')
_SO_TAG_VOCAB_SIZE = flags.DEFINE_integer(
    'so_tag_vocab_size', 500, 'StackOverflow tag prediction: number of tags predicted.')
_SO_SEQUENCE_LENGTH = flags.DEFINE_integer(
    'so_sequence_length', 20, 'StackOverflow next-word prediction: tokens per sequence.')

# Rounds, clients, sampling.
_TOTAL_ROUNDS = flags.DEFINE_integer('total_rounds', 20, 'Number of training rounds.')
_CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', 10,
    'Clients per round: the sample size (fixed_size) or its expectation (poisson).')
_MAX_TRAIN_CLIENTS = flags.DEFINE_integer(
    'max_train_clients', None,
    'Train on only the first N training clients in the dataset\'s client order (e.g. the 400-'
    'client StackOverflow subset of the AdaDPS federated experiment); unset: all clients.')
_CLIENT_SAMPLING = flags.DEFINE_enum(
    'client_sampling', 'poisson', ['poisson', 'fixed_size', 'shuffled'],
    'How clients are drawn each round. poisson: each client independently with probability '
    'q = clients_per_round / population (what the accountant assumes). fixed_size: exactly '
    'clients_per_round without replacement (accounted with the Poisson formula under '
    'add/remove, or the without-replacement RDP bound under replace-one). shuffled: each '
    'epoch a secret permutation in blocks of clients_per_round (DP-FTRL only).')
_WEIGHTING = flags.DEFINE_enum(
    'weighting', 'uniform', ['uniform', 'num_examples'],
    'Client weighting in the average. DP requires uniform (each user contributes equally).')
_CLIENT_EPOCHS = flags.DEFINE_integer(
    'client_epochs_per_round', 1, 'Local epochs each client runs per round.')
_CLIENT_BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 20, 'Local batch size.')
_MAX_ELEMENTS = flags.DEFINE_integer(
    'max_elements_per_client', None,
    'Cap on examples each client uses per round (after repeating epochs); unset: all.')
_CLIENT_CACHE_SIZE = flags.DEFINE_integer(
    'client_cache_size', 1000,
    'Preprocessed client datasets kept in memory across rounds (LRU; 0: rebuild every time).')
_PREFETCH_CLIENTS = flags.DEFINE_bool(
    'prefetch_clients', True,
    'Build the next round\'s client datasets in a background thread while a round runs.')
_LOOP_IMPLEMENTATION = flags.DEFINE_string(
    'loop_implementation', 'dataset_iterator',
    'How TFF runs a client\'s pass over its batches: dataset_iterator (a loop over the '
    'dataset\'s iterator, the fastest on CPU) or dataset_reduce (one DatasetReduce op, TFF\'s '
    'default, needed on TPUs). Same steps, same model.')
_DATASETS_ON_WORKERS = flags.DEFINE_bool(
    'datasets_on_workers', False,
    'Build each sampled client\'s dataset on the TFF worker from its client id (TFF\'s dataset '
    'computation composed into the learning process): a round sends ids instead of serialized '
    'datasets. Every worker must have the task\'s data at the same --data_dir path. Same '
    'results; the coordinator still reads each new client once to check its data.')
_WORKER_RESTART_ROUNDS = flags.DEFINE_integer(
    'worker_restart_rounds', 0,
    'Replace the local TFF worker by a fresh process after every N-th round (0: never). Bounds '
    'the worker\'s memory over long runs (its heap fragments: ~0.3-0.5 MiB per round); same '
    'results, one worker start per restart. No effect with --workers.')
_MAX_CONCURRENT = flags.DEFINE_integer(
    'max_concurrent_computation_calls', -1,
    'Clients the TFF C++ worker trains concurrently (<= 0: all of a round\'s clients at once, '
    'TFF\'s default and the fastest; a cap bounds memory with many clients per round).')
_CLIENT_SLICES = flags.DEFINE_integer(
    'client_slices', 1,
    'Run a round\'s clients in this many slices, one after the other, on the local TFF worker '
    '(TFF\'s mergeable context). The worker holds all clients\' updates of a call until their '
    'sum (~75 MiB per StackOverflow-tag client), so slices bound its peak memory; same results '
    'up to float summation order. Not with --workers.')
_WORKERS = flags.DEFINE_string(
    'workers', None,
    'Spread each round\'s clients over TFF workers at host:port,host:port,... (start one per '
    'host with `python -m tff_dp.worker --port N`). Unset: one local TFF worker.')
_WORKER_UNAVAILABLE_TIMEOUT = flags.DEFINE_float(
    'worker_unavailable_timeout', 60.0,
    'With --workers: seconds a worker may be unreachable before the round fails (TFF alone '
    'would retry forever). The run then stops cleanly; --resume continues.')
_WORKER_RPC_TIMEOUT = flags.DEFINE_float(
    'worker_rpc_timeout', None,
    'With --workers: deadline in seconds of each call to a worker (bounds a hung worker; must '
    'exceed the longest client training call). Unset: none.')
_SEED = flags.DEFINE_integer(
    'seed', 0, 'Seed for model initialisation, client data order and the eval subset (never '
    'for client sampling or DP noise, which are secret).')
_SAMPLING_SEED = flags.DEFINE_integer(
    'sampling_seed', None,
    'Make client sampling reproducible from this seed (simulations, tests). Unset: each '
    'round\'s sample is drawn from OS randomness and is secret, as the accountant\'s '
    'amplification by sampling assumes. When set, the privacy statement says the samples are '
    'known to whoever holds the seed.')
_PRIVATE_RELEASE = flags.DEFINE_bool(
    'private_release', False,
    'Keep every non-private diagnostic (sampled and rejected client counts, client names, '
    'zeroed updates, timings, client training metrics) out of the console, metrics.csv, '
    'TensorBoard and plots, so that the run\'s outputs can be published as they are.')

# Optimizers.
_CLIENT_OPT = flags.DEFINE_enum(
    'client_optimizer', 'sgd', ['sgd', 'adam', 'adagrad', 'rmsprop', 'yogi'],
    'Client (local) optimizer.')
_CLIENT_LR = flags.DEFINE_float('client_learning_rate', 0.1, 'Client learning rate.')
_SERVER_OPT = flags.DEFINE_enum(
    'server_optimizer', 'sgd', ['sgd', 'adam', 'adagrad', 'rmsprop', 'yogi'],
    'Server optimizer applied to the (noised) average update.')
_SERVER_LR = flags.DEFINE_float('server_learning_rate', 1.0, 'Server learning rate.')
_SERVER_MOMENTUM = flags.DEFINE_float(
    'server_momentum', 0.9, 'Server momentum (sgd only; 0 disables).')

# Differential privacy.
_DP = flags.DEFINE_enum(
    'dp', 'adaptive',
    ['none', 'fixed', 'adaptive', 'per_layer_adaptive', 'joint', 'ftrl', 'ftrl_adaptive'],
    'DP aggregation: fixed clip, flat adaptive clip (quantile-estimated), per-layer adaptive '
    'clips, joint clipping with per-vector scales, DP-FTRL tree noise with fixed or adaptive '
    'clip (needs --client_sampling=shuffled), or none (plain FedAvg).')
_RESTART_WARMUP = flags.DEFINE_integer(
    'restart_warmup', 128, 'ftrl_adaptive: restart the tree (adopting the clip estimate) '
    'after this many rounds, ...')
_RESTART_FREQUENCY = flags.DEFINE_integer(
    'restart_frequency', 1024, '... then every this many rounds (and after every epoch).')
_CLIP = flags.DEFINE_float(
    'clip', None, 'L2 clip norm of each client update (the initial clip when adaptive).')
_NOISE = flags.DEFINE_float(
    'noise_multiplier', None,
    'Effective noise multiplier z (noise stddev / sensitivity of the whole round). With '
    'adaptive clipping part of it is spent on the clipped-count query.')
_TARGET_QUANTILE = flags.DEFINE_float(
    'target_unclipped_quantile', 0.5, 'Adaptive clipping: target quantile gamma of update norms.')
_CLIP_LR = flags.DEFINE_float(
    'clip_learning_rate', 0.2, 'Adaptive clipping: learning rate eta_C of the clip update.')
_CLIP_RULE = flags.DEFINE_enum(
    'clip_update_rule', 'geometric', ['geometric', 'linear'],
    'Adaptive clipping: geometric C*exp(-eta*(b-gamma)) or linear C - eta*(b-gamma).')
_CLIPPED_COUNT_STDDEV = flags.DEFINE_float(
    'clipped_count_stddev', None,
    'Adaptive clipping: noise stddev sigma_b of the clipped-count sum (default '
    'clients_per_round / 20, as recommended in Andrew et al.).')
_NOISE_ALLOCATION = flags.DEFINE_enum(
    'noise_allocation', 'proportional', ['proportional', 'dimensionality'],
    'Per-layer/joint: how the noise budget is split across groups (ledger paper, Sec. 4).')
_DELTA = flags.DEFINE_float(
    'delta', None, 'Target delta for reported epsilon (default: < 1/population, at most 1e-5).')
_MAX_EPSILON = flags.DEFINE_float(
    'max_epsilon', None, 'Stop cleanly before the round that would push epsilon above this.')
_ACCOUNTING = flags.DEFINE_list(
    'accounting', ['rdp', 'pld'], 'Accountants that report epsilon each round (rdp, pld).')
_PLD_EVERY = flags.DEFINE_integer(
    'pld_every', 10,
    'Report PLD epsilon every N rounds (PLD costs ~0.25 s per report; RDP is reported every '
    'round). Rerun `python -m tff_dp.accounting` on the ledger for a full PLD curve.')

# AdaDPS.
_PRECONDITION = flags.DEFINE_enum(
    'precondition', 'none', ['none', 'client', 'server'],
    'AdaDPS: precondition the local SGD steps (client) or the update before clipping (server).')
_SIDE_INFO = flags.DEFINE_string(
    'side_info', 'word_freq',
    'AdaDPS side information: word_freq or tag_freq (public StackOverflow counts), public_clients '
    '(second moments on --num_public_clients held-out clients) or file:PATH (.npy/.npz).')
_PRECOND_CAP = flags.DEFINE_float(
    'precondition_cap', 1000.0, 'AdaDPS frequency preconditioner: cap on max(freq)/freq.')
_PRECOND_DIVISION = flags.DEFINE_float(
    'precondition_division', 1.0, 'AdaDPS frequency preconditioner: divisor of the scales.')
_PRECOND_EPS = flags.DEFINE_float(
    'precondition_eps', 1e-8, 'AdaDPS second-moment preconditioner: eps in 1/sqrt(v + eps).')
_PRECONDITIONER = flags.DEFINE_enum(
    'preconditioner', 'auto', ['auto', 'frequency', 'rank', 'second_moment', 'direct'],
    'AdaDPS preconditioner built from the side information. auto: frequency for word/tag '
    'counts, second_moment for public_clients, direct for a scales file. rank: the '
    '--precondition_num_frequent most frequent tokens keep scale 1, all others get '
    '--precondition_rare_scale (the AdaDPS federated code: 100 and 200).')
_PRECOND_NUM_FREQUENT = flags.DEFINE_integer(
    'precondition_num_frequent', 100, 'AdaDPS rank preconditioner: tokens left unscaled.')
_PRECOND_RARE_SCALE = flags.DEFINE_float(
    'precondition_rare_scale', 200.0, 'AdaDPS rank preconditioner: scale of the other tokens.')
_NUM_PUBLIC_CLIENTS = flags.DEFINE_integer(
    'num_public_clients', 10,
    'AdaDPS public_clients: first N clients held out from training as public data.')

# Checkpoint aggregation (Recycling Scraps).
_EMA_BETA = flags.DEFINE_float(
    'ema_beta', None, 'Evaluate an EMA of server models with this beta (unset: off).')
_PAST_K = flags.DEFINE_integer(
    'past_k', 0, 'Evaluate the uniform average of the last k server models (0: off).')
_TRAIN_ON_AGGREGATE = flags.DEFINE_enum(
    'train_on_aggregate', 'none', ['none', 'ema', 'past_k'],
    'Start each round from this aggregate instead of the last iterate (Algorithm 1).')
_AGGREGATE_START_ROUND = flags.DEFINE_integer(
    'aggregate_start_round', 0, 'Round tau after which training starts from the aggregate.')
_UNCERTAINTY_LAST_K = flags.DEFINE_integer(
    'uncertainty_last_k', 0,
    'Write uncertainty.json: variance of test accuracy and prediction scores over the last k '
    'checkpoints (0: off).')

# Outputs.
_ROOT_OUTPUT_DIR = flags.DEFINE_string('root_output_dir', 'runs', 'Root of run directories.')
_EXPERIMENT_NAME = flags.DEFINE_string(
    'experiment_name', None, 'Run directory name (default: TASK-DP-TIMESTAMP).')
_ROUNDS_PER_EVAL = flags.DEFINE_integer('rounds_per_eval', 1, 'Evaluate every N rounds.')
_MAX_EVAL_EXAMPLES = flags.DEFINE_integer(
    'max_eval_examples', 2000, 'Test examples used per evaluation (0: all).')
_ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer(
    'rounds_per_checkpoint', 10,
    'Checkpoint every N rounds. A resume restarts after the last checkpoint; rounds after it that '
    'had already released metrics are re-executed and counted again in the ledger (conservative). '
    '1: exact resume, at ~0.3 s per round for the SavedModel write.')
_RESUME = flags.DEFINE_bool(
    'resume', False, 'Continue the run in ROOT_OUTPUT_DIR/EXPERIMENT_NAME from its checkpoint.')

# What the run reproduces: recorded in config.json and read by `python -m tff_dp.tables`.
_PAPER_TABLE = flags.DEFINE_string(
    'paper_table', '', 'Paper table this run reproduces, e.g. "Andrew et al. 2021, Table 2" '
    '(set by the flag files in experiments/).')
_PAPER_ARM = flags.DEFINE_string(
    'paper_arm', '', 'Row/arm of --paper_table this run reproduces, e.g. "adaptive, z=0.1".')
_PAPER_NOTE = flags.DEFINE_string(
    'paper_note', '', 'Free-text remark on the paper\'s numbers, shown under the table.')
_PAPER_RESULTS = flags.DEFINE_list(
    'paper_results', [],
    'The paper\'s numbers for this arm as key=value pairs: accuracy (or another eval metric '
    'name, e.g. ema_accuracy), epsilon, delta, rounds. Example: accuracy=0.83,epsilon=5,delta=1e-6')


def _paper_results():
  from tff_dp.errors import UserInputError  # pylint: disable=g-import-not-at-top
  results = {}
  for item in _PAPER_RESULTS.value:
    key, sep, value = item.partition('=')
    try:
      if not sep or not key.strip():
        raise ValueError
      results[key.strip()] = float(value)
    except ValueError:
      raise UserInputError(f'--paper_results: expected key=number, got {item!r}') from None
  return results


def _config():
  from tff_dp.training import experiment  # pylint: disable=g-import-not-at-top
  name = _EXPERIMENT_NAME.value
  if name is None:
    name = f'{_TASK.value}-{_DP.value}-{time.strftime("%Y%m%d-%H%M%S")}'
  runtime_settings = dict(
      workers=_WORKERS.value, max_concurrent_computation_calls=_MAX_CONCURRENT.value,
      client_slices=_CLIENT_SLICES.value,
      worker_unavailable_timeout=_WORKER_UNAVAILABLE_TIMEOUT.value,
      worker_rpc_timeout=_WORKER_RPC_TIMEOUT.value)
  return experiment.ExperimentConfig(
      root_output_dir=_ROOT_OUTPUT_DIR.value, experiment_name=name, resume=_RESUME.value,
      seed=_SEED.value, sampling_seed=_SAMPLING_SEED.value,
      private_release=_PRIVATE_RELEASE.value, task_settings=_task_settings(),
      runtime_settings=runtime_settings, total_rounds=_TOTAL_ROUNDS.value,
      clients_per_round=_CLIENTS_PER_ROUND.value, max_train_clients=_MAX_TRAIN_CLIENTS.value,
      client_sampling=_CLIENT_SAMPLING.value,
      weighting=_WEIGHTING.value, rounds_per_eval=_ROUNDS_PER_EVAL.value,
      rounds_per_checkpoint=_ROUNDS_PER_CHECKPOINT.value,
      max_eval_examples=_MAX_EVAL_EXAMPLES.value,
      client_cache_size=_CLIENT_CACHE_SIZE.value, prefetch_clients=_PREFETCH_CLIENTS.value,
      worker_restart_rounds=_WORKER_RESTART_ROUNDS.value,
      loop_implementation=_LOOP_IMPLEMENTATION.value,
      datasets_on_workers=_DATASETS_ON_WORKERS.value,
      client_optimizer=_CLIENT_OPT.value, client_learning_rate=_CLIENT_LR.value,
      server_optimizer=_SERVER_OPT.value, server_learning_rate=_SERVER_LR.value,
      server_momentum=_SERVER_MOMENTUM.value,
      dp=_DP.value, clip=_CLIP.value, noise_multiplier=_NOISE.value,
      target_unclipped_quantile=_TARGET_QUANTILE.value, clip_learning_rate=_CLIP_LR.value,
      clip_update_rule=_CLIP_RULE.value, clipped_count_stddev=_CLIPPED_COUNT_STDDEV.value,
      noise_allocation=_NOISE_ALLOCATION.value, restart_warmup=_RESTART_WARMUP.value,
      restart_frequency=_RESTART_FREQUENCY.value, delta=_DELTA.value,
      max_epsilon=_MAX_EPSILON.value, accounting=tuple(_ACCOUNTING.value), pld_every=_PLD_EVERY.value,
      precondition=_PRECONDITION.value, side_info=_SIDE_INFO.value,
      precondition_cap=_PRECOND_CAP.value, precondition_division=_PRECOND_DIVISION.value,
      precondition_eps=_PRECOND_EPS.value, preconditioner=_PRECONDITIONER.value,
      precondition_num_frequent=_PRECOND_NUM_FREQUENT.value,
      precondition_rare_scale=_PRECOND_RARE_SCALE.value, num_public_clients=_NUM_PUBLIC_CLIENTS.value,
      ema_beta=_EMA_BETA.value, past_k=_PAST_K.value,
      train_on_aggregate=_TRAIN_ON_AGGREGATE.value,
      aggregate_start_round=_AGGREGATE_START_ROUND.value,
      uncertainty_last_k=_UNCERTAINTY_LAST_K.value,
      paper_table=_PAPER_TABLE.value, paper_arm=_PAPER_ARM.value, paper_note=_PAPER_NOTE.value,
      paper_results=_paper_results())


def _task_settings():
  """Every setting that defines the task and its data (recorded; fixed across a resume)."""
  settings = dict(task=_TASK.value, data_dir=_DATA_DIR.value,
                  embedded_data_dir=None if _DATA_DIR.value else _EMBEDDED_DATA_DIR.value,
                  client_batch_size=_CLIENT_BATCH_SIZE.value,
                  client_epochs_per_round=_CLIENT_EPOCHS.value,
                  max_elements_per_client=_MAX_ELEMENTS.value)
  if _TASK.value == 'emnist':
    settings['only_digits'] = _EMNIST_ONLY_DIGITS.value
  elif _TASK.value == 'stackoverflow_word':
    settings.update(vocab_size=_SO_VOCAB_SIZE.value, sequence_length=_SO_SEQUENCE_LENGTH.value)
  else:
    settings.update(word_vocab_size=_SO_VOCAB_SIZE.value,
                    tag_vocab_size=_SO_TAG_VOCAB_SIZE.value)
  return settings


def _task(settings):
  import tasks  # pylint: disable=g-import-not-at-top
  settings = dict(settings)
  name, data_dir = settings.pop('task'), settings.pop('data_dir')
  embedded_dir = settings.pop('embedded_data_dir')
  if data_dir is None:
    from tasks import synthetic_data  # pylint: disable=g-import-not-at-top
    data_dir = embedded_dir
    synthetic_data.ensure_default_cache(data_dir, name)
  return tasks.build_task(
      name, data_dir, client_batch_size=settings.pop('client_batch_size'),
      client_epochs=settings.pop('client_epochs_per_round'),
      max_elements_per_client=settings.pop('max_elements_per_client'),
      shuffle_seed=_SEED.value, **settings)


def main(argv):
  if len(argv) > 1:
    print(f'error: unexpected arguments {argv[1:]}', file=sys.stderr)
    return 2
  if not flags.FLAGS['verbosity'].present:  # Keep the console to one line per round.
    logging.set_verbosity(logging.WARNING)
    tf.get_logger().setLevel('ERROR')
  import tff_dp  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  from tff_dp import cli_flags  # pylint: disable=g-import-not-at-top
  from tff_dp.errors import RunFailedError  # pylint: disable=g-import-not-at-top
  from tff_dp.errors import RunInterrupted  # pylint: disable=g-import-not-at-top
  from tff_dp.errors import UserInputError  # pylint: disable=g-import-not-at-top
  from tff_dp.training import experiment  # pylint: disable=g-import-not-at-top
  try:
    if _STOP is not None:
      _STOP.raise_if_received('during start-up')
    if _TASK.value not in _TASKS:
      raise UserInputError(f'unknown --task {_TASK.value!r}; choose one of {", ".join(_TASKS)}')
    cfg = _config()
    cfg.validate()   # Cheap checks first: no data is loaded for a bad command line.
    if _CLIENT_SLICES.value < 1:
      raise UserInputError(f'--client_slices must be >= 1, got {_CLIENT_SLICES.value}')
    if _CLIENT_SLICES.value > 1 and _WORKERS.value:
      raise UserInputError('--client_slices is for the local worker; with --workers each '
                           'worker already runs its own slice')
    if _WORKERS.value:
      from tff_dp import distributed  # pylint: disable=g-import-not-at-top
      distributed.install_worker_context(
          distributed.parse_workers(_WORKERS.value),
          unavailable_timeout=_WORKER_UNAVAILABLE_TIMEOUT.value,
          rpc_timeout=_WORKER_RPC_TIMEOUT.value)
    else:
      from tff_dp import runtime  # pylint: disable=g-import-not-at-top
      runtime.configure_execution_context(
          max_concurrent_computation_calls=_MAX_CONCURRENT.value,
          client_slices=_CLIENT_SLICES.value)
    summary = experiment.run(cfg, _task(cfg.task_settings), stop=_STOP,
                             log=lambda line: print(cli_flags.as_flags(line, flags.FLAGS)))
  except UserInputError as e:
    return cli_flags.report(e, flags.FLAGS)
  except RunFailedError as e:
    print(f'error: {cli_flags.as_flags(str(e), flags.FLAGS)}', file=sys.stderr)
    return 1
  except RunInterrupted as e:
    print(str(e), file=sys.stderr)
    return 128 + e.signum
  except KeyboardInterrupt:   # A second Ctrl-C: abort at once (the ledger stays valid).
    print('error: interrupted; outputs written so far are intact, continue with --resume',
          file=sys.stderr)
    return 130
  if summary.get('stopped_by_signal'):
    signum = int(getattr(signal, summary['stopped_by_signal']))
    print(f'stopped by {summary["stopped_by_signal"]} after round {summary["rounds_completed"]}; '
          f'outputs in {summary["run_dir"]} are consistent: continue with --resume')
    return 128 + signum
  print(f'done: {summary["rounds_completed"]} rounds; outputs in {summary["run_dir"]}')
  return 0


if __name__ == '__main__':
  app.run(lambda argv: sys.exit(main(argv)))
