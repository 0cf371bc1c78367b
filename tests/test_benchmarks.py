"""Every benchmark runs at its smallest settings (`--smoke`, issue 25), so none breaks unseen:
a figure of docs/BENCHMARKS.md can always be measured again. Each script runs as `__main__`
with its command line (`runpy`), all in this test process: what breaks a benchmark is its code,
which runs as it does for a user; one interpreter saves each benchmark's TensorFlow import and
first TFF traces. The benchmarks that measure whole runs start `run_experiment.py` processes
themselves, as users do. Numbers at these settings mean nothing and are not checked, only that
the benchmark completes and prints its table."""

import os
import runpy
import sys

import pytest

from tff_dp.execution import runtime
from run_helpers import captured_stdout
from run_helpers import REPO

BENCHMARKS = sorted(f for f in os.listdir(os.path.join(REPO, 'benchmarks'))
                    if f.startswith('bench_') and f.endswith('.py')
                    and f not in ('bench_common.py', 'bench_args.py'))
# Where a benchmark writes data or runs by default outside a temporary directory.
PATHS = {'bench_canaries.py': ('--cache_root', '--out_dir'),
         'bench_population.py': ('--cache_root',), 'bench_scaling.py': ('--cache_dir',),
         'bench_noise_cohort.py': ('--cache_dir',)}


def test_every_benchmark_is_listed_and_has_a_smoke_setting():
  with open(os.path.join(REPO, 'benchmarks', 'run_all.py')) as f:
    run_all = f.read()
  for name in BENCHMARKS:
    assert f"'{name}'" in run_all, name
    with open(os.path.join(REPO, 'benchmarks', name)) as f:
      assert 'bench_args.parse(' in f.read(), name


@pytest.mark.slow
@pytest.mark.parametrize('name', BENCHMARKS)
def test_benchmark_runs_at_its_smallest_settings(name, tmp_path, monkeypatch):
  paths = [f'{flag}={tmp_path / flag.strip("-")}' for flag in PATHS.get(name, ())]
  script = os.path.join(REPO, 'benchmarks', name)
  monkeypatch.chdir(tmp_path)
  monkeypatch.syspath_prepend(os.path.dirname(script))   # As `python benchmarks/NAME` has it.
  monkeypatch.setattr(sys, 'argv', [script, '--smoke', *paths])
  try:
    with captured_stdout() as out:
      runpy.run_path(script, run_name='__main__')
  finally:
    # A benchmark may have installed another TFF context (workers, a client cap): the next one
    # starts from the local default, as in a fresh process.
    runtime.configure_execution_context()
  assert out.getvalue().strip()
