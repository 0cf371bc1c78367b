"""Canary clients for one-shot empirical privacy estimation (Andrew et al., ICLR 2024).

* `CanaryDirections`: the secret random unit directions of inserted and unseen canaries (secret
  cyclic shifts of one secret Gaussian vector), regenerated from a key kept beside the
  checkpoints; their cosines with a model change by one FFT (`directions.py`).
* `CanaryTracker`: a run's canary statistics over rounds (initial weights, running maxima) and
  its two estimates (`tracker.py`).
* `insertion` (TensorFlow, imported on its own): canary clients inside a TFF learning process.
* `cosines`, `all_iterates_statistic`: the test statistics of the final-model and the
  all-iterates threat models; `epsilon_from_cosines_closed_form_null` (the paper's final-model
  estimate), `epsilon_from_cosines` (empirical null), `all_iterates_epsilon`,
  `gaussian_pair_epsilon`; results as `CanaryEstimate` (`estimate.py`).

Importing the package loads numpy and scipy only, no TensorFlow. An estimate is reported beside the
accountant's proven epsilon, never instead of it.
"""

from tff_dp.canaries.directions import as_weight_shapes
from tff_dp.canaries.directions import CanaryDirections
from tff_dp.canaries.directions import coin_inserted
from tff_dp.canaries.directions import new_key
from tff_dp.canaries.directions import dimension
from tff_dp.canaries.directions import flatten
from tff_dp.canaries.directions import INSERTED
from tff_dp.canaries.directions import KEY_BYTES
from tff_dp.canaries.directions import UNSEEN
from tff_dp.canaries.estimate import all_iterates_epsilon
from tff_dp.canaries.estimate import all_iterates_statistic
from tff_dp.canaries.bootstrap import bootstrap_interval
from tff_dp.canaries.estimate import CanaryEstimate
from tff_dp.canaries.estimate import cosines
from tff_dp.canaries.estimate import epsilon_from_cosines
from tff_dp.canaries.estimate import epsilon_from_cosines_closed_form_null
from tff_dp.canaries.bootstrap import EstimateInterval
from tff_dp.canaries.estimate import gaussian_pair_epsilon
from tff_dp.canaries.tracker import CanaryTracker
from tff_dp.canaries.tracker import MIN_CANARIES_FOR_AN_ESTIMATE

__all__ = [
    'as_weight_shapes', 'CanaryDirections', 'coin_inserted', 'new_key', 'dimension', 'flatten',
    'INSERTED', 'KEY_BYTES',
    'UNSEEN',
    'all_iterates_epsilon', 'all_iterates_statistic', 'CanaryEstimate', 'cosines',
    'epsilon_from_cosines', 'epsilon_from_cosines_closed_form_null', 'gaussian_pair_epsilon',
    'CanaryTracker', 'MIN_CANARIES_FOR_AN_ESTIMATE',
]
