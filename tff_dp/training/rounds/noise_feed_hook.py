"""The round hook of a correlated-noise run: its noise is fed from beside the process.

Before each round the round's noise is written into the process state
(`tff_dp.aggregators.noise_feed`); when the round completes the feed moves on. Each checkpoint
holds the feed's seed and step but neither its buffers, which are many model copies (64 bands:
63, so writing them every round multiplied a round's bytes by 33, docs/BENCHMARKS.md), nor the
slot's noise, zeros between rounds (one model copy: half again a `fixed` checkpoint). The
buffers are snapshotted every `snapshot_every` rounds under secret/noise_snapshots/, and a
resume rebuilds them from the newest snapshot at or before its checkpoint by replaying the
rounds between from the seed: the resumed run's noise is bit-identical to the uninterrupted
run's, and no round is re-executed with other noise. Snapshots, like the seed, are secrets of
the run (checkpoints of such a run are under `noise_state_in_checkpoints`).
"""

import os
import re
from typing import Any, Callable, Optional

import numpy as np

from tff_dp import atomic_write
from tff_dp.aggregators import noise_feed
from tff_dp.matrix_factorization import streaming
from tff_dp.training.run_state import round_hooks

KEY = 'correlated_noise'
_SNAPSHOT = re.compile(r'^round_(\d+)\.npz$')
# Snapshots kept: the newest may be of a round whose checkpoint was never written (a stop
# between the two writes), so the one before it is kept too.
_KEEP = 2


def snapshot_every(num_buffers: int) -> int:
  """Rounds between snapshots: twice the buffers, so a snapshot adds half a model copy to a
  round's writes on average, and a resume replays at most that many rounds (each costs
  `num_buffers` model-sized multiply-adds and one draw)."""
  return max(1, 2 * num_buffers)


class NoiseFeedHook(round_hooks.RoundHook):
  """Feeds `feed` (a `noise_feed.NoiseFeed`) the run's rounds; keeps its buffers' snapshots
  in `folder` every `every` rounds (default `snapshot_every`)."""

  def __init__(self, feed, folder: str, every: Optional[int] = None,
               log: Callable[[str], None] = lambda line: None):
    self._feed = feed
    self._folder = folder
    self._every = every or snapshot_every(feed.stream.num_buffers)
    self._log = log

  def start(self, process, state) -> None:
    del process
    self._feed.start(state)

  def restore(self, loaded, process, state) -> None:
    del process, state
    if loaded is None:
      return
    saved = loaded[KEY]
    snapshot = newest_snapshot(self._folder, int(saved['seed']), int(saved['step']))
    replayed = self._feed.restore(saved, snapshot)
    if replayed or snapshot is not None:
      self._log(f'noise state: rebuilt after round {int(saved["step"])} from '
                f'{f"the snapshot of round {snapshot.step}" if snapshot else "the start"} '
                f'({replayed} rounds replayed from the seed)')

  def before_round(self, round_num: int, state: Any) -> Any:
    return self._feed.into(state, round_num)

  def after_round(self, round_: round_hooks.Round) -> None:
    self._feed.commit(round_.num)
    if round_.num % self._every == 0:
      write_snapshot(self._folder, self._feed.seed, self._feed.snapshot())

  def checkpoint_entries(self) -> dict[str, Any]:
    # Seed and step: TFF saves a checkpoint as a SavedModel, traced anew each time at a cost
    # per leaf, so the buffers are not even left as empty leaves (63 of them cost 0.5 s).
    return {KEY: self._feed.state(with_buffers=False)}

  def earlier_checkpoint_entries(self) -> dict[str, Any]:
    return {KEY: self._feed.state()}   # Before issue 53 every checkpoint held the buffers.

  def checkpoint_state(self, state: Any) -> Any:
    return noise_feed.without_noise(state)   # The slot is zeros between rounds.

  def restored_state(self, state: Any, initial_state: Any) -> Any:
    return noise_feed.with_noise_of(state, initial_state)


def write_snapshot(folder: str, seed: int, state: streaming.StreamState) -> None:
  """Writes `state` (the stream of seed `seed` after round `state.step`) durably, owner-only,
  and removes all but the `_KEEP` newest snapshots."""
  os.makedirs(folder, mode=0o700, exist_ok=True)
  with atomic_write.replacing(_path(folder, state.step), mode=0o600, binary=True) as f:
    np.savez(f, *state.buffers, seed=np.int64(seed), step=np.int64(state.step))
  for step in sorted(_steps(folder))[:-_KEEP]:
    os.remove(_path(folder, step))


def newest_snapshot(folder: str, seed: int, at_most: int) -> Optional[streaming.StreamState]:
  """The newest snapshot in `folder` of seed `seed` after round `at_most` or before (None: no
  such snapshot)."""
  for step in sorted((s for s in _steps(folder) if s <= at_most), reverse=True):
    with np.load(_path(folder, step)) as saved:
      if int(saved['seed']) == seed and int(saved['step']) == step:
        buffers = [saved[f'arr_{i}'] for i in range(len(saved.files) - 2)]
        return streaming.StreamState(step, tuple(buffers))
  return None


def _path(folder: str, step: int) -> str:
  return os.path.join(folder, f'round_{step:08d}.npz')   # What `_SNAPSHOT` matches.


def _steps(folder: str) -> list[int]:
  try:
    names = os.listdir(folder)
  except FileNotFoundError:
    return []
  return [int(m.group(1)) for m in map(_SNAPSHOT.match, names) if m]
