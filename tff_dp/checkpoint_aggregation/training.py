"""Training over checkpoint aggregates (Recycling Scraps, Algorithm 1).

Algorithm 1 runs the DP algorithm A from the aggregate instead of the last iterate once t >= tau:
theta_{t+1} = A(theta^AGG_t), theta^AGG_{t+1} = f_AGG(theta_{t+1}, ..., theta_0; p). The aggregate
is always taken over the raw iterates theta_t (the outputs of A), never over earlier aggregates,
so the loop must `update` the aggregate with the weights produced by the round *before*
replacing them. Using the aggregate costs no privacy (post-processing of DP checkpoints).
"""

from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from tff_dp import choices
from tff_dp.checkpoint_aggregation import aggregates as aggregates_lib
from tff_dp.errors import UserInputError

KINDS = tuple(choices.TRAIN_ON_AGGREGATE)

Aggregate = Union[aggregates_lib.EMAAggregate, aggregates_lib.PastKAverage]


class TrainOnAggregate:
  """Decides which weights the next round starts from (Algorithm 1).

  Args:
    kind: 'none' (always the last iterate), 'ema' or 'past_k' (the aggregate of that name).
    start_round: tau. After round `round_num` (the loop's 1-based round number) the next round
      starts from the aggregate iff `round_num >= start_round`; 0 or 1 means from the start.
    p: the parameter of f_AGG (EMA decay beta, or k). Optional: used by `make_aggregate()`, and
      when given `select` checks the aggregate it is handed was built with the same p.

  Use in the round loop (after `process.next`):
    weights = flat weights of the new state
    for agg in aggregates.values(): agg.update(weights)
    start = policy.select(round_num, weights, aggregates)
    if start is not weights: state = policy.apply(process, state, start)
  """

  def __init__(self, kind: str = 'none', start_round: int = 0, p: Optional[float] = None):
    if kind not in KINDS:
      raise UserInputError(f'train-on-aggregate kind must be one of {", ".join(KINDS)}, '
                           f'got {kind!r}')
    if isinstance(start_round, bool) or not isinstance(start_round, (int, np.integer)) or (
        start_round < 0):
      raise UserInputError(f'train-on-aggregate start round (tau) must be an integer >= 0, '
                           f'got {start_round!r}')
    if p is not None and kind == 'none':
      raise UserInputError("train-on-aggregate parameter p has no meaning with kind='none'")
    if p is not None:
      self._check_p_valid(kind, p)
    self.kind = kind
    self.start_round = int(start_round)
    self.p = p

  @staticmethod
  def _check_p_valid(kind: str, p) -> None:
    # Building the aggregate validates p with the aggregate's own messages.
    if kind == 'ema':
      aggregates_lib.EMAAggregate(p)
    else:
      aggregates_lib.PastKAverage(p)

  def make_aggregate(self) -> Aggregate:
    """A fresh aggregate of this policy's kind built with parameter p."""
    if self.kind == 'none' or self.p is None:
      raise UserInputError('make_aggregate needs kind ema or past_k and a parameter p')
    if self.kind == 'ema':
      return aggregates_lib.EMAAggregate(self.p)
    return aggregates_lib.PastKAverage(self.p)

  def is_active(self, round_num: int) -> bool:
    """True iff the round after `round_num` starts from the aggregate (t >= tau)."""
    return self.kind != 'none' and round_num >= self.start_round

  def _find_aggregate(self, aggregates) -> Aggregate:
    if isinstance(aggregates, Mapping):
      if self.kind not in aggregates:
        raise UserInputError(
            f'training over the {self.kind!r} aggregate needs that aggregate to be maintained '
            f'(have: {", ".join(aggregates) or "none"}); set its parameter '
            f'({"`ema_beta`" if self.kind == "ema" else "`past_k`"})')
      agg = aggregates[self.kind]
    else:
      agg = aggregates
    expected = (aggregates_lib.EMAAggregate if self.kind == 'ema'
                else aggregates_lib.PastKAverage)
    if not isinstance(agg, expected):
      raise UserInputError(f'training over {self.kind!r} needs a {expected.__name__}, got '
                           f'{type(agg).__name__}')
    if self.p is not None:
      have = agg.beta if self.kind == 'ema' else agg.k
      if have != self.p:
        raise UserInputError(f'train-on-aggregate p={self.p} but the {self.kind} aggregate was '
                             f'built with {have}')
    return agg

  def select(self, round_num: int, weights: Sequence[np.ndarray],
             aggregates: Union[Mapping[str, Aggregate], Aggregate]) -> Sequence[np.ndarray]:
    """Weights the next round starts from: the aggregate's value once active, else `weights`.

    Returns the very object `weights` when no replacement is due (test with `is not`).
    `aggregates` must already include the checkpoint of `round_num`.
    """
    if not self.is_active(round_num):
      return weights
    value = self._find_aggregate(aggregates).value()
    return weights if value is None else value

  def apply(self, process, state, flat_weights: Sequence[np.ndarray]):
    """`replace_model_weights(process, state, flat_weights)`."""
    return replace_model_weights(process, state, flat_weights)


def model_weights(process, state):
  """The global model weights (`tff.learning.models.ModelWeights`) of `process`'s `state`.

  The state a composed learning process returns (`tff.learning.templates.LearningAlgorithmState`)
  is already on the coordinator, so its weights are read from it; `process.get_model_weights`
  is a computation call that sends the whole state to TFF's worker and back (~30 ms for the
  EMNIST CNN on an idle machine, far more under load). Other states fall back to that call.
  """
  weights = getattr(state, 'global_model_weights', None)
  return process.get_model_weights(state) if weights is None else weights


def replace_model_weights(process, state, flat_weights: Sequence[Any]):
  """Returns `state` with its global model weights set to `flat_weights` (trainable first).

  Only the model changes: server optimizer and aggregator (DP query) states are kept, which is
  what Algorithm 1 asks for. The split into trainable / non-trainable, shapes and dtypes are taken
  from the current weights of `state`.
  """
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top

  current = model_weights(process, state)
  trainable = list(current.trainable)
  non_trainable = list(current.non_trainable)
  reference = trainable + non_trainable
  flat_weights = list(flat_weights)
  if len(flat_weights) != len(reference):
    raise UserInputError(
        f'cannot set model weights: got {len(flat_weights)} arrays, the model has '
        f'{len(trainable)} trainable + {len(non_trainable)} non-trainable')
  new = []
  for i, (w, ref) in enumerate(zip(flat_weights, reference)):
    w, ref = np.asarray(w), np.asarray(ref)
    if w.shape != ref.shape:
      raise UserInputError(f'cannot set model weights: array {i} has shape {w.shape}, the model '
                           f'expects {ref.shape}')
    new.append(w.astype(ref.dtype, copy=False))
  n = len(trainable)
  return process.set_model_weights(
      state, tff.learning.models.ModelWeights(trainable=new[:n], non_trainable=new[n:]))
