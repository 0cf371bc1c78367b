"""What `pip install .` installs (issue 38.5): the library `tff_dp` alone, no top-level module
named `tasks` (nor the command-line scripts, which import it). Oracle: setuptools' own build of
the installed files (`setup.py build_py`, the step every install copies from), run on a copy
of the repository's files."""

import os
import shutil
import subprocess
import sys

from run_helpers import REPO


def test_the_installed_files_are_the_library_alone(tmp_path):
  source = tmp_path / 'source'
  shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
      '.venv', '.git', 'runs', 'data_cache', '__pycache__', 'build', '*.egg-info'))
  built = tmp_path / 'built'
  proc = subprocess.run([sys.executable, 'setup.py', '-q', 'build_py', '--build-lib', str(built)],
                        cwd=source, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert sorted(os.listdir(built)) == ['tff_dp']
  installed = {os.path.relpath(os.path.join(d, f), built)
               for d, _, files in os.walk(built) for f in files}
  # Every module of the library is there (the task registry the tasks fill included).
  assert {'tff_dp/__init__.py', 'tff_dp/training/task_registry.py',
          'tff_dp/sections.py', 'tff_dp/mechanisms/bandmf.py'} <= installed
  assert not any(p.startswith('tasks') or p == 'run_experiment.py' for p in installed)
