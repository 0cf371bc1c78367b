"""Checkpoint aggregation for DP training (Shejwalkar et al., "Recycling Scraps", 2022).

* `EMAAggregate`, `PastKAverage`: aggregates of server-model checkpoints (Contract 4).
* `TrainOnAggregate`, `replace_model_weights`: Algorithm 1, training over the aggregate;
  `model_weights`: the weights of a learning process's state, read without a computation call.
* `last_k_uncertainty`, `write_uncertainty_report`: variance from the last k checkpoints.

All of it is post-processing of DP checkpoints, hence free in privacy. TensorFlow Federated is
imported only by `replace_model_weights`.
"""

from tff_dp.checkpoint_aggregation.aggregates import EMAAggregate
from tff_dp.checkpoint_aggregation.aggregates import PastKAverage
from tff_dp.checkpoint_aggregation.aggregates import SCHEDULES
from tff_dp.checkpoint_aggregation.training import KINDS
from tff_dp.checkpoint_aggregation.training import model_weights
from tff_dp.checkpoint_aggregation.training import replace_model_weights
from tff_dp.checkpoint_aggregation.training import TrainOnAggregate
from tff_dp.checkpoint_aggregation.uncertainty import last_k_uncertainty
from tff_dp.checkpoint_aggregation.uncertainty import write_uncertainty_report

__all__ = [
    'EMAAggregate', 'PastKAverage', 'SCHEDULES', 'KINDS', 'TrainOnAggregate', 'model_weights',
    'replace_model_weights', 'last_k_uncertainty', 'write_uncertainty_report',
]
