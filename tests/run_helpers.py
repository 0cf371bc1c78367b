"""Running the project's scripts as a user does (a fresh interpreter on this checkout) and
reading back what a run wrote; shared by the tests that drive the CLIs end to end."""

import csv
import os
import sys
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script(name: str) -> list[str]:
  """Command prefix running REPO/`name` (e.g. 'run_experiment.py') with this interpreter."""
  return [sys.executable, os.path.join(REPO, name)]


def script_env() -> dict[str, str]:
  """This environment, with the checkout importable and TF's C++ start-up noise off."""
  return dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL='3')


# Set in the environment of the programs a test starts; every process they start (TFF's
# worker_binary included) inherits it, whatever happens to its parent.
_TAG_VARIABLE = 'TFF_DP_TEST_TAG'


def tagged_env() -> tuple[dict[str, str], str]:
  """(`script_env()` plus a fresh tag, the tag), for `tagged_workers`."""
  tag = uuid.uuid4().hex
  return dict(script_env(), **{_TAG_VARIABLE: tag}), tag


def tagged_workers(tag: str) -> set[int]:
  """Live TFF worker binaries started under `tag` (see `tagged_env`): this test's workers only,
  never those of other programs on the machine."""
  marker = f'{_TAG_VARIABLE}={tag}'.encode()
  pids = set()
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        program = f.read().split(b'\0', 1)[0]
      with open(f'/proc/{entry}/environ', 'rb') as f:
        environ = f.read().split(b'\0')
      with open(f'/proc/{entry}/stat') as f:
        state = f.read().rsplit(')', 1)[1].split()[0]
    except OSError:   # Gone, or another user's process (not ours).
      continue
    if os.path.basename(program) == b'worker_binary' and marker in environ and state != 'Z':
      pids.add(int(entry))
  return pids


def metrics_rows(run_dir) -> list[dict[str, str]]:
  """The rows of RUN_DIR/metrics.csv as written (strings)."""
  with open(os.path.join(run_dir, 'metrics.csv'), newline='') as f:
    return list(csv.DictReader(f))
