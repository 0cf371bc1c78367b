"""tff_dp: user-level differentially private federated learning on TensorFlow Federated.

Importing the package installs the worker-shutdown hook (see `tff_dp.runtime`), so any program
that uses our aggregators or processes leaves no TFF `worker_binary` behind.
"""

from tff_dp import runtime as _runtime

_runtime.install_shutdown_hooks()

__version__ = '0.1.0'
