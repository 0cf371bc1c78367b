"""The evaluation part of an experiment, from its output section: which data is evaluated
(the test split, or held-out clients that leave the population), whether the guarantee covers
its metrics, and the evaluation dataset."""

import dataclasses
from typing import Optional

import tensorflow as tf

from tff_dp import sampling
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib
from tff_dp.training import population as population_lib

# The key choosing the held-out evaluation clients, kept under the run directory's secret/.
HOLDOUT_KEY_FILE = 'holdout_key'


@dataclasses.dataclass
class Evaluation:
  """The evaluation data's clients (None: the whole test split), whether its metrics are
  covered, how the statement describes it, and the holdout key to keep (new secret runs)."""
  clients: Optional[list]
  covered: bool
  description: str
  key_to_save: Optional[bytes] = None


def choose(output: config_lib.OutputConfig, sampling_seed: Optional[int], resume: bool, task,
           train_ids: list, key_path: str) -> tuple[Evaluation, list]:
  """(the evaluation, the training ids left for the population)."""
  if output.eval_data == 'public_test':
    return Evaluation(None, True, 'public_test'), train_ids
  if output.eval_data == 'test':
    shared = not set(task.test_data.client_ids).isdisjoint(train_ids)
    return Evaluation(None, not shared, 'test_shared' if shared else 'test_disjoint'), train_ids
  # A client-level split of the test data.
  candidates = population_lib.holdout_candidates(train_ids, task.test_data.client_ids)
  if not candidates:
    raise UserInputError('`eval_data=holdout`: no client of the test split is in the training '
                         'population, so `eval_data=test` is already covered; use it')
  count = population_lib.holdout_count(output.eval_holdout_clients, len(candidates))
  key, key_to_save = None, None
  if sampling_seed is None:
    key = sampling.load_key(key_path, what='holdout key')
    if key is None:
      if resume:
        raise UserInputError(f'`resume`: {key_path} is missing; without the holdout key the '
                             'held-out evaluation clients cannot be chosen again')
      key = key_to_save = sampling.holdout_key(None)
  else:
    key = sampling.holdout_key(sampling_seed)
  held_out = set(sampling.hold_out(candidates, count, key)[0])
  rest = [c for c in train_ids if c not in held_out]
  return Evaluation(sorted(held_out), True, 'holdout', key_to_save), rest


def dataset(task, max_examples: int, seed: int, clients: Optional[list] = None):
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
