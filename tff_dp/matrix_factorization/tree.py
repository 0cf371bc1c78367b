"""Tree-aggregation noise (DP-FTRL, Kairouz et al. 2021), one round at a time, beside the process.

The tree is a linear strategy: round t's noise is the residual N_t - N_{t-1} of the tree's
noise N_t on the prefix sum of rounds 1..t, N_t the weighted sum of the nodes of the complete
subtrees that partition [1, t] (one per 1-bit of t, Dwork et al. 2010). This module computes
what tfp's tree does (`TreeResidualSumQuery` over `TreeAggregator`, or `EfficientTreeAggregator`
for Honaker's 2015 estimate): the same nodes from the same number of standard Gaussian draws,
combined with the same weights, so the noise has the same distribution (the tests compare the
two linear maps from draws to noise exactly). A restarted tree starts from no nodes and
N_0 = 0, as tfp's `RestartQuery` resets it.

Ours rather than tfp's because tfp keeps the nodes (a model copy per level) in the TFF state,
which crosses between Python, the coordinator and the worker every round; here they stay
beside the process and one residual crosses (`tff_dp.aggregators.noise_feed`).
"""

import dataclasses
from typing import Callable, Optional

import numpy as np

from tff_dp.matrix_factorization import streaming

# Levels a tree without restarts is sized for: 2^20 rounds, more than any run.
_UNRESTARTED_LEVELS = 20


@dataclasses.dataclass(frozen=True)
class TreeStream:
  """The residuals of a (restarted) tree's noise, unit stddev per node: `efficient` combines
  each node with its children (Honaker 2015). The tree restarts after every
  `rounds_per_tree`-th round and, with `restart_period`, after the rounds r with
  r % restart_period == restart_warmup (tfp's `PeriodicRoundRestartIndicator`); never if both
  are None."""
  efficient: bool = True
  rounds_per_tree: Optional[int] = None
  restart_period: Optional[int] = None
  restart_warmup: int = 0

  @property
  def num_buffers(self) -> int:
    """The most model-sized arrays the state holds: one node per level of the longest tree."""
    longest = min((n for n in (self.rounds_per_tree, self.restart_period) if n),
                  default=2**_UNRESTARTED_LEVELS - 1)
    return longest.bit_length()

  def leaf(self, round_num, maximum=max):
    """The 1-based leaf round `round_num` fills in its tree: rounds since the last restart
    before it. Arithmetic only, so `round_num` may be a tensor (with `maximum=tf.maximum`)."""
    previous = round_num - 1
    last_restart = 0 * previous
    if self.rounds_per_tree:
      last_restart = maximum(last_restart, previous // self.rounds_per_tree * self.rounds_per_tree)
    if self.restart_period:
      period, warmup = self.restart_period, self.restart_warmup
      last_restart = maximum(last_restart, (previous - warmup) // period * period + warmup)
    return round_num - last_restart

  def restarts_after(self, round_num: int) -> bool:
    return self.leaf(round_num + 1) == 1

  def start(self, size: int, dtype=np.float32) -> streaming.StreamState:
    del size, dtype   # A tree holds no node before its first round.
    return streaming.StreamState(0, ())

  def advance_round(self, state: streaming.StreamState,
                    draw: Callable[[int], np.ndarray]) -> tuple[np.ndarray,
                                                                streaming.StreamState]:
    """(the noise of round state.step + 1, the state after it); `draw(k)` is the round's k-th
    standard Gaussian draw. The state holds the nodes of the complete subtrees left of the next
    leaf, lowest level first (their levels are the 1-bits of the leaf just filled)."""
    leaf = self.leaf(state.step + 1)
    held_levels = _one_bits(leaf - 1)
    held = state.buffers if leaf > 1 else ()
    # The new node closes the subtrees of levels 0, 1, ... below it (leaf - 1's trailing ones).
    closed = 0
    while closed < len(held_levels) and held_levels[closed] == closed:
      closed += 1
    node = draw(0)
    if self.efficient:   # tfp: node = (left + right) / 2 + fresh, level by level upwards.
      for level in range(closed):
        node += held[level]
        node *= node.dtype.type(0.5)
        node += draw(level + 1)
    nodes = (node,) + tuple(held[closed:])
    noise = self._prefix_noise((closed,) + held_levels[closed:], nodes)
    noise -= self._prefix_noise(held_levels, held)
    if self.restarts_after(state.step + 1):
      nodes = ()   # The tree is complete: the next round starts a new one.
    return noise, streaming.StreamState(state.step + 1, nodes)

  def _prefix_noise(self, levels: tuple, nodes: tuple) -> np.ndarray:
    """N_t: the nodes' sum, each weighted 1 / (2 - 2^-level) if efficient (tfp's unbiased
    reweighting); 0 for no nodes."""
    if not nodes:
      return np.float32(0.0)
    total = np.zeros_like(nodes[0])
    for level, node in zip(levels, nodes):
      weight = 1.0 / (2.0 - 0.5**level) if self.efficient else 1.0
      total += node * node.dtype.type(weight)
    return total


def _one_bits(n: int) -> tuple:
  """The positions of n's 1-bits, lowest first."""
  return tuple(level for level in range(n.bit_length()) if n >> level & 1)
