"""What `tff_dp.run` needs of a task: the protocol a user's own task implements (our EMNIST and
StackOverflow tasks, `tasks.FederatedTask`, implement it too).

A task is any object with these members (Contract 3 in docs/ARCHITECTURE.md):

  name                 str: recorded in config.json and in default run names
  train_data           a TFF `ClientData` of raw examples: `client_ids`,
                       `create_tf_dataset_for_client(id)`
  test_data            a TFF `ClientData`: `client_ids`, `create_tf_dataset_from_all_clients(
                       seed=)`, and `serializable_dataset_fn(id)` for `eval_data=holdout`
  preprocess_train(ds) a raw client dataset -> batched model input (the client's local epochs)
  preprocess_eval(ds)  raw evaluation data -> batched model input
  model_fn()           a new `tff.learning.models.VariableModel` (what TFF trains)
  keras_model_fn()     a new Keras model of the same architecture (central evaluation)
  loss_fn()            the Keras loss; metrics_fn(): Keras metrics (one named `accuracy` is the
                       one the console and tables show)

Optional: `train_dataset_for_client(id)` (= preprocess_train of the client's data, built faster),
`train_dataset_computation` (a TFF computation id -> that dataset, for datasets built on the
workers), `word_counts` / `tag_counts` (AdaDPS side information). The run's task settings
(`TaskConfig`: data directory, batch size, ...) are how a registered task is built; a task
object given to `tff_dp.run` is used as it is.
"""

from tff_dp.errors import UserInputError

REQUIRED = ('name', 'train_data', 'test_data', 'preprocess_train', 'preprocess_eval',
            'model_fn', 'keras_model_fn', 'loss_fn', 'metrics_fn')
_CALLABLE = REQUIRED[3:]


def check(task):
  """`task`, if it implements the protocol; UserInputError naming what it lacks."""
  missing = [m for m in REQUIRED if not hasattr(task, m)]
  not_callable = [m for m in _CALLABLE if hasattr(task, m) and not callable(getattr(task, m))]
  if missing or not_callable:
    raise UserInputError(
        f'task {getattr(task, "name", type(task).__name__)!r} is not a task: '
        + '; '.join(filter(None, [
            f'it lacks {", ".join(missing)}' if missing else '',
            f'{", ".join(not_callable)} must be callable' if not_callable else '']))
        + ' (see tff_dp.training.task_protocol)')
  if not isinstance(task.name, str) or not task.name:
    raise UserInputError('task.name must be a non-empty string')
  return task
