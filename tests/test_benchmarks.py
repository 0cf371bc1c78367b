"""Every benchmark runs at its smallest settings (`--smoke`, issue 25), so none breaks unseen:
a figure of docs/BENCHMARKS.md can always be measured again. Each runs as a user runs it (its own process);
its numbers at these settings mean nothing and are not checked, only that it completes and
prints its table."""

import os
import subprocess
import sys

import pytest

from run_helpers import REPO
from run_helpers import script_env

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
def test_benchmark_runs_at_its_smallest_settings(name, tmp_path):
  paths = [f'{flag}={tmp_path / flag.strip("-")}' for flag in PATHS.get(name, ())]
  done = subprocess.run([sys.executable, os.path.join(REPO, 'benchmarks', name), '--smoke',
                         *paths], cwd=tmp_path, env=script_env(), capture_output=True,
                        text=True, timeout=600)
  assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
  assert done.stdout.strip(), done.stderr[-2000:]
