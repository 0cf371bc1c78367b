"""The Python blocks of the README and of docs/ run exactly as printed (issue 25): every name
they use is defined in the block itself; the README's trains on the embedded data in a temporary
directory, docs/PYTHON_API.md's pipelines account eight DP-FTRL rounds and six BLT rounds."""

import os
import re
import subprocess
import sys
import time

import dp_accounting
import pytest

from run_helpers import captured_stdout
from run_helpers import REPO
from run_helpers import script_env
from run_helpers import tagged_env
from run_helpers import tagged_workers


PAGES = ('README.md', 'docs/PYTHON_API.md')


def _python_blocks() -> list[tuple[str, str]]:
  """[(page, block)] for every ```python block of PAGES."""
  blocks = []
  for page in PAGES:
    with open(os.path.join(REPO, page)) as f:
      blocks += [(page, b) for b in re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)]
  return blocks


def test_the_pages_have_their_python_blocks():
  pages = [page for page, _ in _python_blocks()]
  assert pages.count('README.md') == 1 and pages.count('docs/PYTHON_API.md') >= 2


@pytest.mark.parametrize('index', range(len(_python_blocks())))
@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_python_block_runs_as_printed(index, tmp_path, monkeypatch):
  page, block = _python_blocks()[index]
  monkeypatch.chdir(tmp_path)   # runs/ and the embedded data go here.
  with captured_stdout() as out:
    exec(compile(block, f'{page} python block {index}', 'exec'), {})
  printed = out.getvalue()
  assert len(printed) < 4000, printed[:500]   # No 23 KB of weights.
  if 'tff_dp.run(' in block:
    assert 'RunSummary(rounds_completed=3' in printed and 'user-level' in printed
    assert os.path.exists(tmp_path / 'runs' / 'so1' / 'summary.json')
  elif "'blt'" in block:
    # Six rounds of the BLT planned for six: one Gaussian mechanism with multiplier z = 1.
    found = re.search(r'epsilon (\d+\.\d+) \(RDP\) at delta 1e-3 after 6 rounds', printed)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(1.0))
    assert found and float(found.group(1)) == pytest.approx(acc.get_epsilon(1e-3), abs=1e-3)
    assert 'zero-out (replace-special): matrix mechanism under b-min-separation' in printed
  elif 'build_unweighted_fed_avg' in block:
    assert re.search(r'epsilon \d+\.\d+ at delta 1e-3 after 8 rounds', printed), printed
  else:
    assert "DPConfig(kind='adaptive', clip=1.0" in printed, printed


@pytest.mark.slow
def test_the_pipeline_block_as_a_program_leaves_no_worker(tmp_path):
  block = next(b for _, b in _python_blocks() if 'build_unweighted_fed_avg' in b)
  env, tag = tagged_env()
  done = subprocess.run([sys.executable, '-c', block], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  time.sleep(0.5)
  assert not tagged_workers(tag)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_importing_the_package_changes_nothing_process_wide():
  program = '''
import atexit, gc, signal, subprocess
# Third-party modules register exit hooks of their own: imported before counting.
import dp_accounting, matplotlib.pyplot, tensorflow, tensorflow_federated, tensorflow_privacy
before, thresholds = atexit._ncallbacks(), gc.get_threshold()
import tff_dp, tff_dp.aggregators, tff_dp.training.api, tff_dp.training.experiment
from tff_dp.execution import gc_thresholds
from tensorflow_federated.python.core.impl.executor_stacks import executor_factory
print(atexit._ncallbacks() == before, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
      executor_factory.subprocess is subprocess, gc.get_threshold() == thresholds)
from tff_dp.execution import runtime
runtime.manage_workers()
gc_thresholds.use_for_a_program()
print(atexit._ncallbacks() > before, signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL,
      executor_factory.subprocess is not subprocess, gc.get_threshold() != thresholds)
'''
  done = subprocess.run([sys.executable, '-c', program], env=script_env(), capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split() == ['True'] * 8, done.stdout


@pytest.mark.parametrize('page', sorted(['README.md'] + [
    os.path.join('docs', n) for n in os.listdir(os.path.join(REPO, 'docs')) if n.endswith('.md')]))
def test_code_fences_pair_up_so_the_page_renders(page):
  """Every fence opens with a language (or none) and is closed: a stray fence turns the rest of
  the page into a code block (the README's "Command line" section once was)."""
  with open(os.path.join(REPO, page)) as f:
    fences = [line.rstrip('\n') for line in f if line.startswith('```')]
  assert len(fences) % 2 == 0, fences
  assert all(close == '```' for close in fences[1::2]), fences
