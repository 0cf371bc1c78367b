"""The README's Python blocks run exactly as printed (issue 25): every name they use is defined
in the block itself; the first trains on the embedded data in a temporary directory."""

import os
import re

import pytest

from run_helpers import captured_stdout
from run_helpers import REPO


def _python_blocks():
  with open(os.path.join(REPO, 'README.md')) as f:
    return re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)


def test_the_readme_has_python_blocks():
  assert len(_python_blocks()) >= 2


@pytest.mark.parametrize('index', range(len(_python_blocks())))
def test_readme_python_block_runs_as_printed(index, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)   # runs/ and the embedded data go here.
  with captured_stdout() as out:
    exec(compile(_python_blocks()[index], f'README.md python block {index}', 'exec'), {})
  printed = out.getvalue()
  assert len(printed) < 4000, printed[:500]   # No 23 KB of weights.
  if 'tff_dp.run(' in _python_blocks()[index]:
    assert 'RunSummary(rounds_completed=3' in printed and 'user-level' in printed
    assert os.path.exists(tmp_path / 'runs' / 'so1' / 'summary.json')
  else:
    assert re.search(r'epsilon \d+\.\d+ at delta 1e-3 after 8 rounds', printed), printed
