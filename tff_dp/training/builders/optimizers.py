"""Name -> `tff.learning.optimizers` builder (TFF 0.87 dropped Keras optimizers from tff.learning)."""

import tensorflow_federated as tff

from tff_dp import choices
from tff_dp.errors import UserInputError


def _sgd(learning_rate, momentum, beta_1, beta_2, epsilon):
  del beta_1, beta_2, epsilon
  return tff.learning.optimizers.build_sgdm(learning_rate=learning_rate, momentum=momentum or None)


def _adam(learning_rate, momentum, beta_1, beta_2, epsilon):
  del momentum
  return tff.learning.optimizers.build_adam(
      learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)


def _adagrad(learning_rate, momentum, beta_1, beta_2, epsilon):
  del momentum, beta_1, beta_2
  return tff.learning.optimizers.build_adagrad(learning_rate=learning_rate, epsilon=epsilon)


def _rmsprop(learning_rate, momentum, beta_1, beta_2, epsilon):
  del momentum, beta_1, beta_2
  return tff.learning.optimizers.build_rmsprop(learning_rate=learning_rate, epsilon=epsilon)


def _yogi(learning_rate, momentum, beta_1, beta_2, epsilon):
  del momentum
  return tff.learning.optimizers.build_yogi(
      learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=max(epsilon, 1e-3))


_BUILDERS = {'sgd': _sgd, 'adam': _adam, 'adagrad': _adagrad, 'rmsprop': _rmsprop, 'yogi': _yogi}
choices.check_implemented(choices.OPTIMIZERS, _BUILDERS, 'tff_dp.training.builders.optimizers')
OPTIMIZER_NAMES = tuple(choices.OPTIMIZERS)


def build_optimizer(name: str, learning_rate: float, *, momentum: float = 0.0,
                    beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7):
  """Returns a `tff.learning.optimizers.Optimizer` for `name`."""
  if learning_rate <= 0:
    raise UserInputError(f'learning rate must be positive, got {learning_rate}')
  if name not in _BUILDERS:
    raise UserInputError(
        f'unknown optimizer {name!r}; choose one of {", ".join(OPTIMIZER_NAMES)}')
  return _BUILDERS[name](learning_rate, momentum, beta_1, beta_2, epsilon)
