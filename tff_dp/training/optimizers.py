"""Name -> `tff.learning.optimizers` builder (TFF 0.87 dropped Keras optimizers from tff.learning)."""

import tensorflow_federated as tff

from tff_dp.errors import UserInputError

OPTIMIZER_NAMES = ('sgd', 'adam', 'adagrad', 'rmsprop', 'yogi')


def build_optimizer(name: str, learning_rate: float, *, momentum: float = 0.0,
                    beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7):
  """Returns a `tff.learning.optimizers.Optimizer` for `name`."""
  if learning_rate <= 0:
    raise UserInputError(f'learning rate must be positive, got {learning_rate}')
  if name == 'sgd':
    return tff.learning.optimizers.build_sgdm(
        learning_rate=learning_rate, momentum=momentum or None)
  if name == 'adam':
    return tff.learning.optimizers.build_adam(
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  if name == 'adagrad':
    return tff.learning.optimizers.build_adagrad(learning_rate=learning_rate, epsilon=epsilon)
  if name == 'rmsprop':
    return tff.learning.optimizers.build_rmsprop(learning_rate=learning_rate, epsilon=epsilon)
  if name == 'yogi':
    return tff.learning.optimizers.build_yogi(
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=max(epsilon, 1e-3))
  raise UserInputError(f'unknown optimizer {name!r}; choose one of {", ".join(OPTIMIZER_NAMES)}')
