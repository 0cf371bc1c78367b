"""The `privacy_queries` measurement (Contract 1): the executed Gaussian sum queries of a round.

Each DP factory reports, inside its `next` measurements, the privacy tuple (S_g, sigma_g) of
every Gaussian sum query it ran this round, read from the pre-round query state inside the
computation. The training loop turns them into ledger records; nothing is re-derived from flags.
"""

import collections
from typing import Any, Mapping, Optional

import numpy as np

from tff_dp import ledger

MEASUREMENT_KEY = 'privacy_queries'
# Tree-aggregation factories (DP-FTRL) also report {TREE_KEY: {'leaf': int}}: this round's
# 1-based position in its noise tree; their `privacy_queries` stddevs are per tree node.
TREE_KEY = 'tree_aggregation'


def query_tuple(l2_norm_clip, noise_stddev) -> collections.OrderedDict:
  """One query's measurement entry (TF scalars inside a computation)."""
  return collections.OrderedDict(l2_norm_clip=l2_norm_clip, noise_stddev=noise_stddev)


def find_privacy_queries(metrics: Any) -> list[ledger.GaussianSumQuery]:
  """All queries reported anywhere in a (nested) metrics structure, as Python floats.

  Names are prefixed by the path of keys above their `privacy_queries` block (e.g.
  'preconditioned/update' for a wrapped factory), so nested factories stay distinguishable.
  """
  found: list[ledger.GaussianSumQuery] = []

  def visit(node, path):
    if isinstance(node, Mapping):
      for key, value in node.items():
        if key == MEASUREMENT_KEY and isinstance(value, Mapping):
          prefix = '/'.join(path)
          for name, q in value.items():
            full = f'{prefix}/{name}' if prefix else str(name)
            found.append(ledger.GaussianSumQuery(
                name=full, l2_norm_clip=float(np.asarray(q['l2_norm_clip'])),
                noise_stddev=float(np.asarray(q['noise_stddev']))))
        else:
          visit(value, path + [str(key)])
    elif hasattr(node, '_asdict'):
      visit(node._asdict(), path)

  visit(metrics, [])
  return found


def find_tree_leaf(metrics: Any) -> Optional[int]:
  """This round's 1-based leaf in its aggregation tree, or None if no tree factory reported one.

  Several reports (nested tree factories) must agree: a ledger record has one tree position.
  """
  leaves = set()

  def visit(node):
    if isinstance(node, Mapping):
      for key, value in node.items():
        if key == TREE_KEY and isinstance(value, Mapping):
          leaves.add(int(np.asarray(value['leaf'])))
        else:
          visit(value)
    elif hasattr(node, '_asdict'):
      visit(node._asdict())

  visit(metrics)
  if len(leaves) > 1:
    raise ValueError(f'the aggregator reported different tree leaves {sorted(leaves)} in one '
                     'round')
  return leaves.pop() if leaves else None
