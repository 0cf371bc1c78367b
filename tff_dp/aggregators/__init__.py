"""DP aggregation factories (genuine `tff.aggregators.UnweightedAggregationFactory`s).

Every factory reports `privacy_queries` (docs/ARCHITECTURE.md, Contract 1) in its measurements,
and declares each measurement it reports (`measurements()`, `tff_dp.measurements`).
Which factory a mechanism builds, with which arguments, is the mechanism's own declaration
(`tff_dp.mechanisms`, `build_aggregator`).
"""


from tff_dp.aggregators.adaptive import AdaptiveClipGaussianFactory
from tff_dp.aggregators.correlated_noise import CorrelatedNoiseFactory
from tff_dp.aggregators.fixed import FixedClipGaussianFactory
from tff_dp.aggregators.reporting import ReportingDPFactory
from tff_dp.aggregators.ftrl import FtrlFactory
from tff_dp.aggregators.ftrl_adaptive import FtrlAdaptiveFactory
from tff_dp.aggregators.joint import JointClipFactory
from tff_dp.aggregators.per_layer import PerLayerAdaptiveClipFactory
from tff_dp.aggregators.privacy_queries import MEASUREMENT_KEY
from tff_dp.aggregators.privacy_queries import find_privacy_queries
from tff_dp.aggregators.privacy_queries import find_tree_leaf
from tff_dp.adaptive_clipping import AdaptiveClipping
