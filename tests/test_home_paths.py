"""`~` in a path a user types (a flag, a config field) is expanded where the library uses it,
so every program and in-process caller gets it (shells leave `--flag=~/x` alone)."""

import numpy as np
import pytest

import tasks
from tasks import synthetic_data
from tff_dp.adadps import side_information
from tff_dp.training.run_state import run_dir as run_dir_lib


@pytest.fixture
def home(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path))
  return tmp_path


def test_root_output_dir(home):
  run_dir = run_dir_lib.RunDirectory('~/runs', 'exp', resume=False)
  try:
    run_dir.create()
  finally:
    run_dir.close()
  assert run_dir.path == str(home / 'runs' / 'exp')
  assert (home / 'runs' / 'exp' / 'checkpoints').is_dir()


def test_task_data_dir(home):
  synthetic_data.write_emnist_cache(str(home / 'cache'), num_train_clients=2,
                                    examples_per_client=2, seed=0)
  task = tasks.build_task('emnist', '~/cache')
  assert len(task.train_data.client_ids) == 2


def test_side_information_file(home):
  np.save(home / 'scales.npy', np.full((3,), 2.0))
  info = side_information.load_side_info_file('~/scales.npy', [(3,)])
  np.testing.assert_array_equal(info.values[0], [2.0, 2.0, 2.0])
