"""Groups of a model's tensors for per-group clipping, and the query that regroups records.

A grouping partitions the flat tensor indices of the model update; per-layer adaptive clipping
(`per_layer.py`) and joint clipping (`joint.py`) both clip each group with its own query.
tfp's nested queries need the record to have the structure of the query, so
`RegroupedSumQuery` (ours: neither tfp nor TFF regroups records) maps the flat model update
into a list of groups and the noised sum back into the model structure.
"""

from typing import Callable, Sequence, Union

import numpy as np
import tensorflow as tf
import tensorflow_privacy as tfp
from tensorflow_privacy.privacy.dp_query import nested_query
from tensorflow_federated.python.core.impl.types import type_conversions

from tff_dp.errors import UserInputError

# None: one group per tensor; list of lists of flat tensor indices; or a function of the list of
# flat tensor shapes returning such a list.
Groups = Union[None, Sequence[Sequence[int]], Callable[[list], Sequence[Sequence[int]]]]


def value_specs_and_shapes(value_type):
  """(tf.TensorSpec structure, list of flat shapes) of a TFF value type of float tensors."""
  specs = type_conversions.type_to_tf_tensor_specs(value_type)
  flat = tf.nest.flatten(specs)
  for i, spec in enumerate(flat):
    if not spec.dtype.is_floating:
      raise TypeError(f'DP aggregation needs float tensors; leaf {i} is {spec}')
  return specs, [tuple(s.shape) for s in flat]


def resolve_groups(groups: Groups, shapes: Sequence[tuple]) -> list[list[int]]:
  """Validated partition of the flat tensor indices into groups."""
  n = len(shapes)
  if groups is None:
    resolved = [[i] for i in range(n)]
  elif callable(groups):
    resolved = groups(list(shapes))
  else:
    resolved = groups
  resolved = [[int(i) for i in g] for g in resolved]
  seen = sorted(i for g in resolved for i in g)
  if any(not g for g in resolved) or seen != list(range(n)):
    raise UserInputError(
        f'clip groups must partition the {n} tensor indices 0..{n - 1} into non-empty groups '
        f'(each index exactly once); got {resolved}')
  return resolved


def group_sizes(groups: Sequence[Sequence[int]], shapes: Sequence[tuple]) -> list[int]:
  return [int(sum(int(np.prod(shapes[i])) for i in g)) for g in groups]


def group_names(num_groups: int) -> list[str]:
  return [f'group_{g}' for g in range(num_groups)]


class RegroupedSumQuery(tfp.SumAggregationDPQuery):
  """Runs a `NestedSumQuery` over a list of groups on records with the model's structure.

  Written here because tfp's NestedQuery requires the record to already have the query's
  nested structure; this only permutes tensors (no effect on sensitivity or noise).
  """

  def __init__(self, inner: nested_query.NestedSumQuery, groups, value_specs):
    self._inner = inner
    self._groups = [list(g) for g in groups]
    self._specs = value_specs
    self._num_leaves = len(tf.nest.flatten(value_specs))

  @property
  def inner(self):
    return self._inner

  def _group(self, value):
    flat = tf.nest.flatten(value)
    return [[flat[i] for i in g] for g in self._groups]

  def _ungroup(self, grouped):
    flat = [None] * self._num_leaves
    for g, values in zip(self._groups, grouped):
      for i, v in zip(g, values):
        flat[i] = v
    return tf.nest.pack_sequence_as(self._specs, flat)

  def initial_global_state(self):
    return self._inner.initial_global_state()

  def derive_sample_params(self, global_state):
    return self._inner.derive_sample_params(global_state)

  def initial_sample_state(self, template=None):
    return self._inner.initial_sample_state(self._group(template))

  def preprocess_record(self, params, record):
    return self._inner.preprocess_record(params, self._group(record))

  def accumulate_preprocessed_record(self, sample_state, preprocessed_record):
    return self._inner.accumulate_preprocessed_record(sample_state, preprocessed_record)

  def merge_sample_states(self, sample_state_1, sample_state_2):
    return self._inner.merge_sample_states(sample_state_1, sample_state_2)

  def get_noised_result(self, sample_state, global_state):
    result, new_state, event = self._inner.get_noised_result(sample_state, global_state)
    return self._ungroup(result), new_state, event

  def derive_metrics(self, global_state):
    return self._inner.derive_metrics(global_state)
