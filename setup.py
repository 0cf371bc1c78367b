"""tff-dp: user-level differentially private federated learning on TensorFlow Federated.

Dependencies are pinned in requirements/lock.txt and installed by `make setup`; TFF 0.87.0 itself
must be installed with --no-deps (its jaxlib==0.4.14 pin is unavailable; see BUILD_NOTES.md), so
it is deliberately not listed in install_requires. Nor are TensorFlow (the CPU build
tensorflow-cpu by default, the GPU build `tensorflow` on request: docs/INSTALL.md "GPU"; pip cannot
express "either") and tensorflow-privacy (it requires `tensorflow`, which would pull in the GPU
build); both come from the lock.
"""

import setuptools

setuptools.setup(
    name='tff-dp',
    version='0.1.0',
    description='User-level DP federated learning on TFF: adaptive clipping, privacy ledger, '
    'AdaDPS preconditioning, checkpoint aggregation.',
    packages=setuptools.find_packages(include=['tff_dp', 'tff_dp.*']),
    python_requires='>=3.11,<3.12',
    install_requires=[
        'absl-py==1.4.0',
        'dp-accounting==0.4.3',
        'matplotlib==3.8.4',
        'numpy==1.25.2',
    ],
)
