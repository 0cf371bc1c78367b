"""tff_dp: user-level differentially private federated learning on TensorFlow Federated.

`tff_dp.run(tff_dp.ExperimentConfig(...))` runs a whole experiment (docs/PYTHON_API.md).
Both are imported on first use, so `import tff_dp` stays cheap (no TensorFlow until `run`).

Importing the package changes nothing process-wide. `run` makes sure no TFF `worker_binary`
outlives the program (`tff_dp.execution.runtime.manage_workers()`); a pipeline that uses only the
aggregators makes that one call itself (docs/PYTHON_API.md, "Using the aggregators in your own TFF
pipeline").
"""

__version__ = '0.1.0'
__all__ = ['ExperimentConfig', 'run']


def __getattr__(name):
  # pylint: disable=g-import-not-at-top  (start-up time: `run` imports TensorFlow)
  if name == 'run':
    from tff_dp.training.api import run
    return run
  if name == 'ExperimentConfig':
    from tff_dp.training.config import ExperimentConfig
    return ExperimentConfig
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
