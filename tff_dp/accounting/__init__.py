"""Post-hoc privacy accounting of the ledger (RDP + PLD), noise calibration, and a CLI.

`python -m tff_dp.accounting --help` for the command line.
"""

from tff_dp.accounting.accountant import check_analysable
from tff_dp.accounting.accountant import check_delta
from tff_dp.accounting.accountant import suggested_delta
from tff_dp.accounting.accountant import collapsed_dp_event
from tff_dp.accounting.accountant import TREE_RELATION
from tff_dp.noise_budget import effective_noise_multiplier
from tff_dp.accounting.accountant import epsilon_curve
from tff_dp.accounting.accountant import LedgerAccountant
from tff_dp.accounting.accountant import record_to_dp_event
from tff_dp.accounting.calibration import calibrate_noise_multiplier
from tff_dp.accounting.calibration import CalibrationResult
from tff_dp.accounting.calibration import update_noise_multiplier
