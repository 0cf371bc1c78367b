"""What a checkpoint of a run holds (its program-state layout), and saving and loading it.

A checkpoint of round r holds the learning process state after round r, the checkpoint
aggregates' states, the last-k model weights kept for the uncertainty report and, in a run with
canaries, the canary statistics (`canaries.CanaryTracker.get_state`), so that a resumed run
continues exactly where round r left it.
"""

import collections
import dataclasses
from typing import Any, Callable, Mapping, Optional

import numpy as np
import tensorflow as tf


def program_state(state, round_num: int, aggregates: Mapping[str, Any], recent,
                  canary_tracker=None) -> dict:
  """The structure saved for round `round_num` (and the structure a load is matched to); the
  `canaries` entry only in a run with canaries (checkpoints without them keep their layout)."""
  saved = collections.OrderedDict(
      state=state,
      round_num=np.int64(round_num),
      aggregates=collections.OrderedDict(
          (name, agg.get_state()) for name, agg in aggregates.items()),
      recent=list(recent),
  )
  if canary_tracker is not None:
    saved['canaries'] = canary_tracker.get_state()
  return saved


def load_latest(run_dir, initial_state, aggregates: Mapping[str, Any],
                canary_tracker=None) -> Optional[dict]:
  """The latest checkpoint's program state (`program_state`'s keys), or None if none exists."""
  loaded, _ = run_dir.load_latest_checkpoint(
      program_state(initial_state, 0, aggregates, [], canary_tracker))
  return loaded


@dataclasses.dataclass
class Progress:
  """The last completed round and what a checkpoint of it needs."""
  round_num: int
  state: Any
  recent: Any            # collections.deque of the last-k model weights.
  checkpointed: int      # The last round with a checkpoint.
  canary_tracker: Any = None   # canaries.CanaryTracker of a run with canaries.


def save(run_dir, round_num: int, state, aggregates: Mapping[str, Any], recent,
         canary_tracker=None) -> None:
  """Checkpoints round `round_num` (raises on a failed write)."""
  run_dir.save_checkpoint(program_state(state, round_num, aggregates, recent, canary_tracker),
                          round_num)


def save_completed_rounds(run_dir, aggregates: Mapping[str, Any], progress: Progress,
                          log: Callable[[str], None]) -> bool:
  """Checkpoints the last completed round if it was not (so `resume` re-executes nothing);
  whether the last completed round is now checkpointed.

  Called when a run stops early (signal, `max_epsilon`, failed round): a failed write is
  logged, not raised, since the run is stopping anyway and the earlier checkpoint is intact.
  """
  if progress.round_num > progress.checkpointed:
    try:
      save(run_dir, progress.round_num, progress.state, aggregates, progress.recent,
           progress.canary_tracker)
      progress.checkpointed = progress.round_num
    except (OSError, tf.errors.OpError) as e:
      log(f'could not checkpoint round {progress.round_num} ({e}); `resume` restarts from '
          f'round {progress.checkpointed + 1}')
      return False
  return True
