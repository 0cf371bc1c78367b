"""Non-sensitive side information for AdaDPS (Li et al.), mapped onto a model's trainable weights.

A `SideInformation` holds one entry per trainable weight (in `model.trainable_variables` order):
an array broadcastable to that weight's shape, or None where the source says nothing about the
weight (the preconditioner then leaves it unscaled). Broadcastable rather than full-shape arrays
keep e.g. per-word frequencies of a [10000, 500] kernel at [10000, 1] (40 KB, not 20 MB), which
matters because the scales become constants of the TFF computations.

None of these sources reads private training data, so they cost no privacy budget: the public
word/tag counts are published with the dataset, the proxy clients are held out of the private
population, and a user file is chosen before training.
"""

import dataclasses
import os
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tff_dp.errors import UserInputError

# What the values mean; the preconditioner picks its formula from this.
FREQUENCY = 'frequency'          # relative token frequency (>= 0)
SECOND_MOMENT = 'second_moment'  # E[g^2] per coordinate (>= 0)
SCALES = 'scales'                # the per-coordinate scales themselves (user file)
KINDS = (FREQUENCY, SECOND_MOMENT, SCALES)

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SideInformation:
  """Per-weight side information: `values[i]` broadcasts to weight i, or is None (uncovered)."""
  kind: str
  values: tuple[Optional[np.ndarray], ...]
  weight_shapes: tuple[Shape, ...]
  description: str = ''

  def __post_init__(self):
    if self.kind not in KINDS:
      raise UserInputError(f'unknown side information kind {self.kind!r}; one of {KINDS}')
    if len(self.values) != len(self.weight_shapes):
      raise UserInputError(f'side information has {len(self.values)} entries but the model has '
                           f'{len(self.weight_shapes)} trainable weights')
    for i, (v, shape) in enumerate(zip(self.values, self.weight_shapes)):
      if v is None:
        continue
      if np.broadcast_shapes(v.shape, shape) != tuple(shape):
        raise UserInputError(f'side information for weight {i} has shape {v.shape}, which does '
                             f'not broadcast to the weight shape {tuple(shape)}')
      if not np.all(np.isfinite(v)):
        raise UserInputError(f'side information for weight {i} has non-finite values')


def weight_shapes_of(model_or_weights: Any) -> tuple[Shape, ...]:
  """Trainable weight shapes of a Keras model, a `tff.learning.models.VariableModel`,
  `tff.learning.models.ModelWeights`, or a sequence of arrays / TensorSpecs / shapes."""
  if hasattr(model_or_weights, 'trainable_variables'):
    items = model_or_weights.trainable_variables
  elif hasattr(model_or_weights, 'trainable'):
    items = model_or_weights.trainable
  else:
    items = model_or_weights
  shapes = []
  for item in items:
    if hasattr(item, 'shape'):
      shapes.append(tuple(int(d) for d in item.shape))
    else:
      shapes.append(tuple(int(d) for d in item))
  return tuple(shapes)


def _find_weight(weight_shapes: Sequence[Shape], size: int, axis: int,
                 weight_index: Optional[int]) -> int:
  if weight_index is not None:
    if not 0 <= weight_index < len(weight_shapes):
      raise UserInputError(f'weight_index {weight_index} out of range: the model has '
                           f'{len(weight_shapes)} trainable weights')
    shape = weight_shapes[weight_index]
    if len(shape) <= axis or shape[axis] != size:
      raise UserInputError(f'weight {weight_index} has shape {shape}; expected size {size} on '
                           f'axis {axis}')
    return weight_index
  matches = [i for i, s in enumerate(weight_shapes) if len(s) >= 2 and s[axis] == size]
  if len(matches) != 1:
    raise UserInputError(
        f'cannot tell which weight the {size} tokens index (axis {axis}): candidates {matches} '
        f'among trainable shapes {list(weight_shapes)}; pass weight_index')
  return matches[0]


def token_frequency_side_info(counts: Mapping[str, int], weight_shapes: Sequence[Shape], *,
                              vocab: Optional[Sequence[str]] = None, axis: int = 0,
                              weight_index: Optional[int] = None,
                              smoothing: float = 0.0) -> SideInformation:
  """Public token frequencies (e.g. `task.word_counts`) on the axis of the weight they index.

  `counts` is the OrderedDict of `tff.simulation.datasets.stackoverflow.load_word_counts`
  (or `load_tag_counts`). `vocab` is the model's token order (default: the first n keys of
  `counts`, n = the weight's size on `axis`, which is how the StackOverflow tasks build their
  vocabularies). For the tag-prediction logistic regression the kernel is [words, tags]: words
  are axis 0, tags axis 1. Tokens missing from `counts` get count 0 (+ `smoothing`).
  """
  weight_shapes = tuple(tuple(s) for s in weight_shapes)
  if not counts:
    raise UserInputError('token counts are empty')
  if vocab is None:
    if weight_index is None:
      candidates = [i for i, s in enumerate(weight_shapes) if len(s) >= 2]
      if len(candidates) != 1:
        raise UserInputError(f'cannot tell which of the weights {list(weight_shapes)} the tokens '
                             'index; pass vocab or weight_index')
      weight_index = candidates[0]
    size = weight_shapes[weight_index][axis]
    if size > len(counts):
      raise UserInputError(f'weight {weight_index} has {size} rows on axis {axis} but only '
                           f'{len(counts)} token counts were given')
    vocab = list(counts.keys())[:size]
  idx = _find_weight(weight_shapes, len(vocab), axis, weight_index)
  freq = np.array([float(counts.get(tok, 0)) for tok in vocab], np.float64) + smoothing
  if np.any(freq < 0):
    raise UserInputError('token counts must be non-negative')
  total = float(sum(counts.values())) + smoothing * len(vocab)
  freq = (freq / total).astype(np.float32)
  shape = [1] * len(weight_shapes[idx])
  shape[axis] = len(vocab)
  values = [None] * len(weight_shapes)
  values[idx] = freq.reshape(shape)
  return SideInformation(FREQUENCY, tuple(values), weight_shapes,
                         f'token frequencies on axis {axis} of weight {idx}')


def public_second_moment_side_info(
    keras_model: tf.keras.Model, loss_fn: Callable[[Any, Any], tf.Tensor],
    datasets: Iterable[Iterable[Any]], *, max_batches_per_client: Optional[int] = None,
) -> SideInformation:
  """Average squared minibatch gradient E_pub[g^2] on held-out public/proxy clients.

  This is the second-moment (RMSProp/Adam denominator) statistic of the AdaDPS reference code
  (`estimate_preconditioner`), estimated once at the model's current weights (set them to the
  initial global model before calling). `datasets` yields, per public client, batches of
  `(x, y)` (or dicts with keys `x`, `y`) as produced by the task's `preprocess_train`.
  """
  variables = keras_model.trainable_variables
  if not variables:
    raise UserInputError('the model has no trainable weights')

  @tf.function
  def squared_grads(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, keras_model(x, training=False))
    grads = tape.gradient(loss, variables)
    return [tf.zeros_like(v) if g is None else tf.square(tf.convert_to_tensor(g))
            for v, g in zip(variables, grads)]

  sums = [np.zeros(v.shape, np.float64) for v in variables]
  num_batches = 0
  for client_ds in datasets:
    for b, batch in enumerate(client_ds):
      if max_batches_per_client is not None and b >= max_batches_per_client:
        break
      x, y = (batch['x'], batch['y']) if isinstance(batch, Mapping) else batch
      for s, g2 in zip(sums, squared_grads(x, y)):
        s += g2.numpy()
      num_batches += 1
  if num_batches == 0:
    raise UserInputError('the public clients have no data to estimate gradient statistics on')
  values = tuple((s / num_batches).astype(np.float32) for s in sums)
  return SideInformation(SECOND_MOMENT, values, weight_shapes_of(keras_model),
                         f'E[g^2] over {num_batches} public batches')


def load_side_info_file(path: str, weight_shapes: Sequence[Shape], *,
                        kind: str = SCALES, weight_names: Optional[Sequence[str]] = None,
                        ) -> SideInformation:
  """User-supplied side information from `.npy` / `.npz`, validated against the model.

  `.npy`: either one flat vector with as many entries as the model has trainable parameters
  (weights concatenated in `trainable_variables` order), or an array broadcastable to exactly
  one trainable weight (the others stay uncovered). `.npz`: entries keyed by weight index
  (`'0'`, `'1'`, ...), by `arr_<i>` (`np.savez` positional), or by `weight_names`; each must
  broadcast to its weight; missing weights stay uncovered; unknown keys are an error.
  `kind` says what the numbers are (default: the scales themselves).
  """
  weight_shapes = tuple(tuple(s) for s in weight_shapes)
  path = os.path.expanduser(path)   # `~` as a user may type it in `side_info=file:~/x.npy`.
  if not os.path.exists(path):
    raise UserInputError(f'side information file not found: {path}')
  shapes_msg = f'the model\'s trainable weight shapes are {list(weight_shapes)}'
  try:
    loaded = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise UserInputError(f'cannot read side information file {path}: {e}') from e
  values: list[Optional[np.ndarray]] = [None] * len(weight_shapes)
  if isinstance(loaded, np.ndarray):
    arr = loaded.astype(np.float32)
    total = sum(int(np.prod(s)) for s in weight_shapes)
    if arr.ndim == 1 and arr.size == total:
      offset = 0
      for i, s in enumerate(weight_shapes):
        n = int(np.prod(s))
        values[i] = arr[offset:offset + n].reshape(s)
        offset += n
    else:
      matches = [i for i, s in enumerate(weight_shapes) if _broadcasts(arr.shape, s)]
      if len(matches) != 1:
        raise UserInputError(
            f'{path}: array of shape {arr.shape} must be a flat vector of all {total} trainable '
            f'parameters or broadcast to exactly one weight (matches {matches}); {shapes_msg}')
      values[matches[0]] = arr
  else:
    names = {str(i): i for i in range(len(weight_shapes))}
    names.update({f'arr_{i}': i for i in range(len(weight_shapes))})
    if weight_names:
      names.update({n: i for i, n in enumerate(weight_names)})
    with loaded:
      for key in loaded.files:
        if key not in names:
          raise UserInputError(f'{path}: unknown key {key!r}; use weight indices 0..'
                               f'{len(weight_shapes) - 1} or arr_<i>; {shapes_msg}')
        i = names[key]
        arr = loaded[key].astype(np.float32)
        if not _broadcasts(arr.shape, weight_shapes[i]):
          raise UserInputError(f'{path}: entry {key!r} has shape {arr.shape}, which does not '
                               f'broadcast to weight {i} of shape {weight_shapes[i]}; {shapes_msg}')
        values[i] = arr
  if all(v is None for v in values):
    raise UserInputError(f'{path} covers no trainable weight; {shapes_msg}')
  return SideInformation(kind, tuple(values), weight_shapes, f'file {path}')


def _broadcasts(shape, target) -> bool:
  try:
    return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
  except ValueError:
    return False
