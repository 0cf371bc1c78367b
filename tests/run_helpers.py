"""Running the project's scripts as a user does (a fresh interpreter on this checkout) and
reading back what a run wrote; shared by the tests that drive the CLIs end to end."""

import csv
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script(name: str) -> list[str]:
  """Command prefix running REPO/`name` (e.g. 'run_experiment.py') with this interpreter."""
  return [sys.executable, os.path.join(REPO, name)]


def script_env() -> dict[str, str]:
  """This environment, with the checkout importable and TF's C++ start-up noise off."""
  return dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='3')


def metrics_rows(run_dir) -> list[dict[str, str]]:
  """The rows of RUN_DIR/metrics.csv as written (strings)."""
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))
