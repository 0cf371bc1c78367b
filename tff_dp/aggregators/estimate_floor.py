"""The positive floor on every adapted clip and scale (flat, per-layer and joint adaptive).

All three adaptive factories adapt a clip (or joint scale alpha_j) with tensorflow_privacy's
`QuantileEstimatorQuery`, which does not bound its estimate: the linear rule steps it to 0 or
below (tiny updates, a large learning rate), and the geometric rule underflows to 0, where it
stays (0 * e^x = 0), for a vector whose updates are all zero. tfp's
`QuantileAdaptiveClipSumQuery` clamps the clip it derives at 0, which is fatal too: clipping to
0 computes x * 0 / max(||x||, 0), so an all-zero record (which TFF itself sends when it zeroes
a client's non-finite update) gives 0/0 = NaN, and the whole aggregate is NaN from then on. A
joint scale divides each record, so alpha_j = 0 is x/0 (and a negative alpha is no scale).

So the estimate itself (the query state, not only the value used) is projected onto
[MIN_ESTIMATE, inf) after each update. This costs no privacy: it is post-processing of the
noised count, and each round's sensitivity is still the clip that round used (for joint
clipping S_g, independent of the scales), which the ledger reads from the pre-round state.
Above the floor nothing changes: max(c, MIN_ESTIMATE) is c, bit for bit, so the flat factory
still reproduces TFF's `gaussian_adaptive` exactly.
"""

import tensorflow as tf
import tensorflow_privacy as tfp

# Far below useful update norms, yet x / 1e-6 (a joint scale) stays far from float32 overflow.
MIN_ESTIMATE = 1e-6


def floored(estimator_state):
  """A `QuantileEstimatorQuery` global state with its estimate projected onto
  [MIN_ESTIMATE, inf)."""
  return estimator_state._replace(
      current_estimate=tf.maximum(estimator_state.current_estimate, MIN_ESTIMATE))


class FlooredQuantileAdaptiveClipSumQuery(tfp.QuantileAdaptiveClipSumQuery):
  """tfp's `QuantileAdaptiveClipSumQuery` whose clip (and quantile estimate) stays >=
  MIN_ESTIMATE.

  A subclass rather than our own query: clipping, noise, the quantile update and the DpEvent
  stay tfp's; only the new global state is projected. The sum state is rebuilt from the
  floored estimate as tfp builds it (clip = estimate, stddev = clip * noise_multiplier), so
  above the floor it equals tfp's state exactly.
  """

  def get_noised_result(self, sample_state, global_state):
    result, new_state, event = super().get_noised_result(sample_state, global_state)
    estimator_state = floored(new_state.quantile_estimator_state)
    clip = estimator_state.current_estimate
    sum_state = new_state.sum_state._replace(l2_norm_clip=clip,
                                             stddev=clip * new_state.noise_multiplier)
    return result, new_state._replace(sum_state=sum_state,
                                      quantile_estimator_state=estimator_state), event
