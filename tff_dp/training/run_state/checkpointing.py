"""What a checkpoint of a run holds (its program-state layout), and saving and loading it.

A checkpoint of round r holds the learning process state after round r and each round hook's
entries (`RoundHook.checkpoint_entries`: the checkpoint aggregates' states, the last-k model
weights of the uncertainty report, the canary statistics), so that a resumed run continues
exactly where round r left it. The entries follow `state` and `round_num` in the hooks' order.
"""

import collections
import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp.training.run_state import round_hooks


def program_state(state, round_num: int, hooks: Sequence[round_hooks.RoundHook], *,
                  earlier: bool = False) -> dict:
  """The structure saved for round `round_num` (and the structure a load is matched to;
  `earlier`: that of the checkpoints an earlier version wrote)."""
  for hook in hooks:
    state = hook.checkpoint_state(state)
  saved = collections.OrderedDict(state=state, round_num=np.int64(round_num))
  for hook in hooks:
    entries = hook.earlier_checkpoint_entries() if earlier else hook.checkpoint_entries()
    for key, value in entries.items():
      if key in saved:
        raise ValueError(f'two round hooks checkpoint the entry {key!r}')
      saved[key] = value
  return saved


def load_latest(run_dir, initial_state, hooks: Sequence[round_hooks.RoundHook]
                ) -> Optional[dict]:
  """The latest checkpoint's program state (`program_state`'s keys), or None if none exists;
  in the current structure or, failing that, in the earlier one."""
  try:
    loaded, _ = run_dir.load_latest_checkpoint(program_state(initial_state, 0, hooks))
  except (ValueError, TypeError) as in_current:   # Perhaps a checkpoint of an earlier version.
    try:
      loaded, _ = run_dir.load_latest_checkpoint(
          program_state(initial_state, 0, hooks, earlier=True))
    except (ValueError, TypeError):
      raise in_current   # In neither: the mismatch with today's structure is the one to read.
  return loaded


@dataclasses.dataclass
class Progress:
  """The last completed round, its state, and the last round with a checkpoint (one more than
  `round_num` while that round's outputs are being released)."""
  round_num: int
  state: Any
  checkpointed: int
  hooks_round: Optional[int] = None   # The last round the round hooks took in (None: round_num).

  def hooks_ahead(self) -> bool:
    """Whether the round hooks took in a round after `round_num` whose release was cut short:
    their checkpoint entries (aggregates, recent models, canary statistics) are then no longer
    those of round `round_num`."""
    return self.hooks_round is not None and self.hooks_round > self.round_num


def save(run_dir, round_num: int, state, hooks: Sequence[round_hooks.RoundHook]) -> None:
  """Checkpoints round `round_num` (raises on a failed write)."""
  run_dir.save_checkpoint(program_state(state, round_num, hooks), round_num)


def save_completed_rounds(run_dir, hooks: Sequence[round_hooks.RoundHook], progress: Progress,
                          log: Callable[[str], None]) -> bool:
  """Checkpoints the last completed round if it was not (so `resume` re-executes nothing);
  whether the last completed round is now checkpointed.

  Called when a run stops early (signal, `max_epsilon`, failed round): a failed write is
  logged, not raised, since the run is stopping anyway and the earlier checkpoint is intact.
  """
  if progress.round_num > progress.checkpointed:
    if progress.hooks_ahead():   # Round round_num's hook entries are gone: never mixed.
      log(f'round {progress.round_num} can no longer be checkpointed: the round hooks took in '
          f'round {progress.hooks_round}, whose release was cut short; `resume` restarts from '
          f'round {progress.checkpointed + 1}')
      return False
    try:
      save(run_dir, progress.round_num, progress.state, hooks)
      progress.checkpointed = progress.round_num
    except tff.program.ProgramStateExistsError:
      # Written by a save that a second signal cut short after its (atomic) rename, as it
      # removed older checkpoints: complete, so kept (TFF refuses to write a round twice).
      progress.checkpointed = progress.round_num
    except (OSError, tf.errors.OpError) as e:
      log(f'could not checkpoint round {progress.round_num} ({e}); `resume` restarts from '
          f'round {progress.checkpointed + 1}')
      return False
  return True
