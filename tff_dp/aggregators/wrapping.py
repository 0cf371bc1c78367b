"""Checks shared by factories that wrap an inner unweighted factory (AdaDPS scaling, NaN/Inf
zeroing): both transform every float leaf of a client value before the inner factory sees it."""

import numpy as np
import tensorflow_federated as tff


def check_inner_factory(inner_factory) -> tff.aggregators.UnweightedAggregationFactory:
  """`inner_factory`, or TypeError if it is not an unweighted aggregation factory."""
  if not isinstance(inner_factory, tff.aggregators.UnweightedAggregationFactory):
    raise TypeError('inner_factory must be an UnweightedAggregationFactory, got '
                    f'{type(inner_factory)}')
  return inner_factory


def float_leaf_types(value_type, owner: str) -> list:
  """The flat leaf types of `value_type`; TypeError naming `owner` if one is not a float tensor."""
  flat_types = tff.structure.flatten(value_type)
  for i, t in enumerate(flat_types):
    if not (isinstance(t, tff.TensorType) and np.issubdtype(t.dtype, np.floating)):
      raise TypeError(f'{owner} needs float tensors; leaf {i} is {t}')
  return flat_types
