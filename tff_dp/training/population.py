"""A run's population from its task's client ids: which training clients it samples from, and
the checks its size decides. Pure Python (no TensorFlow).

The run builds its population from the task's training ids: `split_public` keeps
`max_train_clients` of them less AdaDPS's public ones, `build_evaluation.choose` holds out the
evaluation clients (`holdout_count` of them), and the inserted canaries join. The command line
has the same ids before TensorFlow is imported when the task lists them without it
(`RegisteredTask.client_ids`); `check_before_the_run` then refuses, with the run's own
messages, what no population the run could build allows: a sample larger than it, a delta at
or above 1/N, a correlated-noise schedule it cannot meet.
"""

from typing import Optional, Sequence

from tff_dp import accounting
from tff_dp import mechanisms
from tff_dp import sampling
from tff_dp.accounting import correlated
from tff_dp.errors import UserInputError


def split_public(cfg, train_ids: Sequence) -> tuple[list, list]:
  """(AdaDPS's public client ids, the training ids) of a run with `cfg` (an ExperimentConfig):
  `max_train_clients` of `train_ids`, less the public ones (the paper's OOD setting)."""
  train_ids = list(train_ids)
  limit = cfg.task.max_train_clients
  if limit is not None:
    if limit > len(train_ids):
      raise UserInputError(f'`max_train_clients={limit}` exceeds the '
                           f'{len(train_ids)} training clients')
    train_ids = train_ids[:limit]
  if cfg.adadps.precondition != 'none' and cfg.adadps.side_info == 'public_clients':
    n = cfg.adadps.num_public_clients
    return train_ids[:n], train_ids[n:]
  return [], train_ids


def holdout_candidates(train_ids: Sequence, test_ids: Sequence) -> list:
  """The training clients that have test data, in population order: those `eval_data=holdout`
  holds its evaluation clients out from (TFF's test splits hold later data of training users)."""
  test = set(test_ids)
  return [c for c in train_ids if c in test]


def holdout_count(eval_holdout_clients: Optional[int], candidates: int) -> int:
  """How many of the `candidates` (training clients with test data) `eval_data=holdout` holds
  out: `eval_holdout_clients`, or a tenth of them (at least 1, at most 1000); checked."""
  count = eval_holdout_clients or max(1, min(1000, candidates // 10))
  sampling.check_holdout_count(count, candidates)
  return count


def check_sample_size(clients_per_round: int, population: int) -> None:
  """Refuses a sample (or expected sample) larger than the population."""
  if population == 0:
    raise UserInputError('the training data has no clients')
  if clients_per_round > population:
    raise UserInputError(f'`clients_per_round={clients_per_round}` exceeds the '
                         f'{population} training clients')


def size_range(cfg, train_ids: Sequence, test_ids: Sequence) -> tuple[int, int]:
  """(fewest, most) clients the population of a run with `cfg` can hold, given the task's
  training and test client ids: the inserted canaries are a range when each is inserted by a
  coin from the run's secret key (`canary_inclusion=coin`), known only once the run drew it."""
  _, train = split_public(cfg, train_ids)
  size = len(train)
  if cfg.output.eval_data == 'holdout':
    candidates = len(holdout_candidates(train, test_ids))
    if candidates:   # None: the run refuses `holdout` with its own message.
      size -= holdout_count(cfg.output.eval_holdout_clients, candidates)
  canaries = cfg.canaries
  if not canaries.num_canaries:
    return size, size
  if canaries.canary_inclusion == 'coin':
    return size, size + canaries.num_canaries + canaries.unseen
  return size + canaries.num_canaries, size + canaries.num_canaries


def check_before_the_run(cfg, train_ids: Sequence, test_ids: Sequence) -> None:
  """Raises the run's UserInputError for what the run with `cfg` would refuse on any
  population it could build from these ids (`size_range`)."""
  fewest, most = size_range(cfg, train_ids, test_ids)
  check_sample_size(cfg.sampling.clients_per_round, most)
  mechanism = mechanisms.find(cfg.dp.kind)
  if mechanism is None:
    return
  if cfg.accounting.delta is not None:
    accounting.check_delta(cfg.accounting.delta, fewest)
  if (mechanism.noise.planned_for_rounds
      and not sampling.get(cfg.sampling.client_sampling).grouped):
    correlated.planned_schedule(cfg.mechanism_settings(),
                        sampling.rounds_per_epoch(most, cfg.sampling.clients_per_round),
                        cfg.training.total_rounds)
