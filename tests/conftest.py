"""Shared fixtures. The test session sets itself up as a program using the package does
(`runtime.manage_workers()`, `gc_thresholds.use_for_a_program()`), and the session fixture
below additionally stops TFF's worker_binary at teardown so no test session leaks one.
`tiny_tag_task`: the smallest real task (StackOverflow tag prediction through TFF's loader on a
generated 6-client cache, a 200 x 30 logistic regression), for tests of the FedAvg process."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # noqa: E402

# The repository's tasks, registered as the command lines register them (no TensorFlow): a test
# that runs a registered task in this process finds it whichever files ran before it. That the
# library works without them is tested in subprocesses (tests/test_config.py).
import tasks  # noqa: E402,F401
from tff_dp.execution import gc_thresholds  # noqa: E402
from tff_dp.execution import runtime  # noqa: E402

runtime.manage_workers()
gc_thresholds.use_for_a_program()   # As run_experiment.py: the collector's share of tracing.


@pytest.fixture(scope='session', autouse=True)
def _stop_tff_workers_at_session_end():
  yield
  runtime.shutdown_workers()


@pytest.fixture(scope='session')
def tiny_tag_task(tmp_path_factory):
  from tasks import synthetic_data   # pylint: disable=g-import-not-at-top  (imports TensorFlow)
  path = str(tmp_path_factory.mktemp('tiny_tag_cache'))
  synthetic_data.write_stackoverflow_cache(path, num_train_clients=6, examples_per_client=8,
                                           seed=1, vocab_size=200, num_tags=30, num_topics=5)
  return tasks.build_task('stackoverflow_tag', path, client_batch_size=4, shuffle_seed=0,
                          word_vocab_size=200, tag_vocab_size=30)


@pytest.fixture(scope='session')
def tag_data_dir(tmp_path_factory):
  """A generated StackOverflow cache of 20 training clients (tag task), in TFF's format."""
  from tasks import synthetic_data   # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp('tag_cache'))
  synthetic_data.write_stackoverflow_cache(path, num_train_clients=20, examples_per_client=8,
                                           seed=1, vocab_size=200, num_tags=30, num_topics=5)
  return path


@pytest.fixture(scope='session')
def tag_task(tag_data_dir):
  """The tag task on `tag_data_dir`, read by TFF's loader."""
  import tasks   # pylint: disable=g-import-not-at-top
  return tasks.build_task('stackoverflow_tag', tag_data_dir, client_batch_size=8,
                          shuffle_seed=0, word_vocab_size=200, tag_vocab_size=30)
