"""Shared fixtures. Importing tff_dp installs the worker shutdown hook; the session fixture below
additionally stops TFF's worker_binary at teardown so no test session leaks one."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import pytest  # noqa: E402

import tff_dp  # noqa: E402,F401  (installs the shutdown hook)
from tff_dp import runtime  # noqa: E402


@pytest.fixture(scope='session', autouse=True)
def _stop_tff_workers_at_session_end():
  yield
  runtime.shutdown_workers()
