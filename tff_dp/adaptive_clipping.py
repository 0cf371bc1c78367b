"""The settings of an adaptive clip (Andrew et al.): one type, pure Python, so that the run's
config (checked before TensorFlow loads), the aggregator registry and the adaptive factories
share it."""

import dataclasses
from typing import Optional

from tff_dp import choices
from tff_dp.errors import UserInputError

UPDATE_RULES = tuple(choices.CLIP_UPDATE_RULES)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdaptiveClipping:
  """How an adaptive clip follows the update norms: the one type of these settings, shared by
  the run's config (`DPConfig.adaptive_clipping`), the mechanisms
  (`tff_dp.mechanisms.build_aggregator`) and the adaptive factories (flat, per-layer, joint,
  DP-FTRL). Checked when built.

  target_unclipped_quantile: gamma, the fraction of clients whose update the clip should leave
    unclipped.
  clip_learning_rate: eta, the step of the clip update.
  update_rule: 'geometric' (C <- C exp(-eta (b - gamma))) or 'linear' (C <- C - eta (b - gamma)).
  clipped_count_stddev: sigma_b, the noise of the clipped count (None: max(m/20, z) with noise).
  """
  target_unclipped_quantile: float = 0.5
  clip_learning_rate: float = 0.2
  update_rule: str = 'geometric'
  clipped_count_stddev: Optional[float] = None

  def __post_init__(self):
    if self.update_rule not in UPDATE_RULES:
      raise UserInputError(f'update rule must be {choices.one_of(UPDATE_RULES)}, got '
                           f'{self.update_rule!r}')
    if not 0 < self.target_unclipped_quantile < 1:
      raise UserInputError('target_unclipped_quantile must be in (0, 1), got '
                           f'{self.target_unclipped_quantile}')
    if not self.clip_learning_rate > 0:
      raise UserInputError(
          f'clip_learning_rate must be positive, got {self.clip_learning_rate}')
    if self.clipped_count_stddev is not None and not self.clipped_count_stddev >= 0:
      raise UserInputError(
          f'clipped_count_stddev must be >= 0, got {self.clipped_count_stddev}')

  @property
  def geometric(self) -> bool:
    return self.update_rule == 'geometric'
