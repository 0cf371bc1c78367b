"""AdaDPS (Li et al., "Private Adaptive Optimization with Side Information"): non-sensitive side
information -> per-coordinate preconditioner, applied to local SGD steps (client-side, the
paper's federated Algorithm 3) or to client updates before the DP aggregator (server-side, see
`tff_dp.aggregators.preconditioned`)."""

from tff_dp.adadps.optimizer import build_preconditioned
from tff_dp.adadps.optimizer import build_preconditioned_sgd
from tff_dp.adadps.preconditioner import build_scales
from tff_dp.adadps.preconditioner import frequency_multiplier
from tff_dp.adadps.preconditioner import second_moment_multiplier
from tff_dp.adadps.side_information import load_side_info_file
from tff_dp.adadps.side_information import public_second_moment_side_info
from tff_dp.adadps.side_information import SideInformation
from tff_dp.adadps.side_information import token_frequency_side_info
from tff_dp.adadps.side_information import weight_shapes_of
