"""The round hook of a correlated-noise run: its noise is fed from beside the process.

Before each round the round's noise is written into the process state
(`tff_dp.aggregators.noise_feed`); when the round completes the feed moves on; each checkpoint
holds the feed's seed and buffers (secrets of the run: checkpoints of such a run are under
`noise_state_in_checkpoints`), so that a resumed run continues the same noise.
"""

from typing import Any

from tff_dp.training.run_state import round_hooks

KEY = 'correlated_noise'


class NoiseFeedHook(round_hooks.RoundHook):
  """Feeds `feed` (a `noise_feed.NoiseFeed`) the run's rounds."""

  def __init__(self, feed):
    self._feed = feed

  def start(self, process, state) -> None:
    del process
    self._feed.start(state)

  def restore(self, loaded, process, state) -> None:
    del process, state
    if loaded is not None:
      self._feed.restore(loaded[KEY])

  def before_round(self, round_num: int, state: Any) -> Any:
    return self._feed.into(state, round_num)

  def after_round(self, round_: round_hooks.Round) -> None:
    self._feed.commit(round_.num)

  def checkpoint_entries(self) -> dict[str, Any]:
    return {KEY: self._feed.state()}
