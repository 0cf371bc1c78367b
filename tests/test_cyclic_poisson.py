"""Amplified BandMF (issue 27.3-27.4): cyclic Poisson sampling, its ledger record, and the
accounting of Choquette-Choo et al. 2023, Theorem 4, against dp_accounting built here."""

import collections
import functools
import json
import math
import os
import shutil
import stat
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest

from tff_dp import ledger as ledger_lib
from tff_dp import sampling
from tff_dp.errors import UserInputError
from run_helpers import REPO
from run_helpers import main_in_process
from run_helpers import run_stopped_after
from run_helpers import script_env
from test_correlated_noise import BASE
from test_correlated_noise import _epsilons


def _sqrt_coefs(bands):
  """The banded square root's coefficients, binom(2k, k) / 4^k, column-normalized."""
  c = np.array([math.comb(2 * k, k) / 4**k for k in range(bands)])
  return c / np.linalg.norm(c)


def _amplified_epsilon(q, z, cycles, delta, accountant=None):
  acc = accountant or dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), cycles)
  return acc.get_epsilon(delta)


def test_a_client_is_only_ever_sampled_in_its_groups_rounds_at_rate_q():
  ids = [f'c{i}' for i in range(60)]
  sampler = sampling.build_sampler('cyclic_poisson', ids, 5, seed=3, groups=4)
  assert sampler.probability == pytest.approx(5 * 4 / 60)
  rounds_of = collections.defaultdict(list)
  sizes = []
  for r in range(1, 2001):
    sample = sampler.sample(r)
    assert sampler.sample(r) == sample   # Drawn once per round (the loop prefetches).
    sizes.append(len(sample))
    for c in sample:
      rounds_of[c].append(r)
  # Each client's rounds share one residue mod 4: at least 4 rounds apart, once per cycle.
  assert all(len({(r - 1) % 4 for r in rs}) == 1 for rs in rounds_of.values())
  assert len(rounds_of) == 60
  # The groups partition the population into 15 clients each, each included with q = 1/3:
  # 500 visits per client, so its count is within 5 standard deviations of 500 q.
  sd = math.sqrt(500 * (1 / 3) * (2 / 3))
  assert all(abs(len(rs) - 500 / 3) < 5 * sd for rs in rounds_of.values())
  assert np.mean(sizes) == pytest.approx(5, rel=0.05)
  event = sampler.sampling_event(9)
  assert (event.kind, event.probability, event.groups, event.epoch) == (
      'cyclic_poisson', pytest.approx(1 / 3), 4, 3)


def test_the_partition_is_a_secret_key_and_the_draws_are_secret():
  ids = list(range(40))
  a, b = (sampling.build_sampler('cyclic_poisson', ids, 4, groups=2) for _ in range(2))
  assert a.secret and a.key != b.key
  again = sampling.build_sampler('cyclic_poisson', ids, 4, groups=2, key=a.key)
  # The same key, the same partition on resume (the groups themselves: the clients sampled
  # from them are secret draws, so a union of samples may miss a member).
  for r in (1, 2):
    np.testing.assert_array_equal(again.members(r), a.members(r))
  assert not np.array_equal(b.members(1), a.members(1))   # Another key, another partition.
  with pytest.raises(UserInputError, match='q = 1.2 > 1'):
    sampling.build_sampler('cyclic_poisson', ids, 8, groups=6)
  with pytest.raises(UserInputError, match='groups'):
    sampling.build_sampler('cyclic_poisson', ids, 4)


def test_the_ledger_records_groups_for_cyclic_poisson_only():
  event = ledger_lib.SamplingEvent('cyclic_poisson', 40, probability=0.2, epoch=3, groups=2)
  record = ledger_lib.RoundRecord(5, event, (ledger_lib.GaussianSumQuery('update', 1.0, 1.0),),
                                  None, ledger_lib.CorrelatedNoise('bandmf', 7, 2, 4, bands=2))
  line = json.loads(json.dumps(record.to_json()))
  assert line['sampling']['groups'] == 2
  assert ledger_lib.RoundRecord.from_json(line) == record
  poisson = ledger_lib.SamplingEvent('poisson', 40, probability=0.2).to_json()
  assert 'groups' not in poisson and 'epoch' not in poisson
  with pytest.raises(ledger_lib.LedgerError, match='no groups'):
    ledger_lib.SamplingEvent('poisson', 40, probability=0.2, groups=2)
  with pytest.raises(ledger_lib.LedgerError, match='groups'):
    ledger_lib.SamplingEvent('cyclic_poisson', 40, probability=0.2, epoch=1)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_an_amplified_bandmf_run_is_accounted_as_poisson_sampled_gaussians_per_cycle(
    tag_data_dir, tmp_path):
  root = tmp_path / 'runs'
  args = [a for a in BASE if not a.startswith('--client_sampling')]
  code, out, err = main_in_process('run_experiment.py', args + [
      '--dp=bandmf', '--client_sampling=cyclic_poisson', '--bands=2',
      f'--data_dir={tag_data_dir}', f'--root_output_dir={root}', '--experiment_name=a1'])
  assert code == 0, err[-2000:]
  run = root / 'a1'
  records = ledger_lib.read_ledger(str(run / 'ledger.jsonl'))
  # 20 clients in 2 groups, 4 per round on average: q = 0.4; 7 rounds, so 4 cycles.
  assert [r.sampling.kind for r in records] == ['cyclic_poisson'] * 7
  assert [r.sampling.probability for r in records] == pytest.approx([0.4] * 7)
  assert [r.sampling.epoch for r in records] == [1, 1, 2, 2, 3, 3, 4]
  coefs = _sqrt_coefs(2)
  # Fresh draws at z x clip x the largest column norm (1: the strategy is column-normalized).
  ratio = records[0].queries[0].noise_stddev / records[0].queries[0].l2_norm_clip
  assert ratio == pytest.approx(1.0, rel=1e-9)
  eps = _epsilons(run)
  for t, value in enumerate(eps, 1):
    column = np.linalg.norm(coefs[:min(t, 2)])   # The first t rounds' largest column.
    assert value == pytest.approx(
        _amplified_epsilon(0.4, ratio / column, math.ceil(t / 2), 1e-3), rel=1e-6)
  with open(run / 'metrics.csv') as f:
    header, *lines = [line.strip().split(',') for line in f]
  pld = float(lines[-1][header.index('epsilon_pld')])
  assert pld == pytest.approx(_amplified_epsilon(
      0.4, ratio, 4, 1e-3, dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)),
      rel=1e-6)
  summary = json.loads((run / 'summary.json').read_text())
  assert summary['privacy']['sampling']['groups'] == 2
  assert 'Theorem 4' in summary['privacy']['sampling']['accounted_as']
  assert 'cyclic_poisson' in out


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_secret_partition_is_saved_and_a_resume_continues_with_it(tag_task, tmp_path):
  """The groups are a secret key's: a run stopped mid-cycle kept it (owner-only) and its resume
  continues with the same key; without it a resume is refused (a new partition mid-cycle
  could put a client in two groups of one cycle)."""
  settings = dict(root_output_dir=str(tmp_path), task='stackoverflow_tag', total_rounds=4,
                  clients_per_round=4, dp='bandmf', bands=2, clip=0.5, noise_multiplier=1.0,
                  client_sampling='cyclic_poisson', max_eval_examples=20, delta=1e-3)
  run = functools.partial(run_stopped_after, settings, tag_task)

  assert run('run', stop_after=3).rounds_completed == 3   # Inside the second cycle.
  key_file = tmp_path / 'run' / 'secret' / 'sampling_key'
  key = key_file.read_bytes()
  assert len(key) == 32 and stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
  shutil.copytree(tmp_path / 'run', tmp_path / 'keyless')
  os.remove(tmp_path / 'keyless' / 'secret' / 'sampling_key')
  with pytest.raises(UserInputError, match='sampling_key is missing'):
    run('keyless', resume=True)
  # A resume on another population than the recorded one is refused before anything is
  # written (issue 36, M1).
  shutil.copytree(tmp_path / 'run', tmp_path / 'moved')
  (tmp_path / 'moved' / 'secret' / 'population_digest').write_bytes(
      sampling.population_digest(['someone', 'else']))
  before = sorted(os.walk(tmp_path / 'moved'))
  with pytest.raises(UserInputError, match='not the one this run sampled'):
    run('moved', resume=True)
  assert sorted(os.walk(tmp_path / 'moved')) == before
  assert run('run', resume=True).rounds_completed == 4
  assert key_file.read_bytes() == key
  mac_key = (tmp_path / 'run' / 'secret' / 'ledger_key').read_bytes()
  records = ledger_lib.read_ledger(str(tmp_path / 'run' / 'ledger.jsonl'), mac_key=mac_key)
  assert [(r.round_num, r.sampling.epoch) for r in records] == [(1, 1), (2, 1), (3, 2), (4, 2)]
  # Every secret is owner-only, the checkpoints TFF writes included (issue 36, L4).
  secret_files = [os.path.join(p, f) for p, _, fs in os.walk(tmp_path / 'run' / 'secret')
                  for f in fs]
  assert any('checkpoints' in f for f in secret_files)
  assert {stat.S_IMODE(os.stat(f).st_mode) for f in secret_files} == {0o600}


@pytest.mark.parametrize('extra, message', [
    (['--dp=blt', '--bands=2'], '--bands is a setting of --dp=bandmf'),
    (['--dp=blt'], 'amplifies bandmf only'),
    (['--dp=bandmf'], 'needs --bands'),
    (['--dp=bandmf', '--bands=2', '--min_separation=2'],
     '--min_separation is a setting of --client_sampling=min_separation'),
    (['--dp=fixed'], 'use --dp=bandmf, or'),
    (['--dp=bandmf', '--bands=6'], 'q = 1.2 > 1'),
])
def test_what_cyclic_poisson_cannot_amplify_is_refused_before_anything_is_written(
    extra, message, tag_data_dir, tmp_path):
  args = [a for a in BASE if not a.startswith('--client_sampling')]
  code, _, err = main_in_process('run_experiment.py', args + extra + [
      '--client_sampling=cyclic_poisson', f'--data_dir={tag_data_dir}',
      f'--root_output_dir={tmp_path / "runs"}'])
  assert code == 2 and message in err, err[-2000:]
  assert not os.path.exists(tmp_path / 'runs')


def test_the_accountant_refuses_bands_wider_than_the_groups():
  from tff_dp import accounting
  acc = accounting.LedgerAccountant(1e-5, ('rdp',))
  event = ledger_lib.SamplingEvent('cyclic_poisson', 40, probability=0.2, epoch=1, groups=2)
  record = ledger_lib.RoundRecord(1, event, (ledger_lib.GaussianSumQuery('update', 1.0, 1.0),),
                                  None, ledger_lib.CorrelatedNoise('bandmf', 6, 2, 3, bands=3))
  with pytest.raises(UserInputError, match='bands=3` exceeds the 2 groups'):
    acc.add(record)


def test_calibration_prints_the_noise_multiplier_of_amplified_bandmf():
  out = subprocess.run(
      [sys.executable, '-m', 'tff_dp.accounting', '--target_epsilon=2', '--delta=1e-6',
       '--mechanism=bandmf', '--sampling=cyclic_poisson', '--rounds=100', '--bands=8',
       '--clients_per_round=50', '--population=4000'],
      cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  values = dict(line.split('=', 1) for line in out.stdout.split('\n')[:2])
  z = float(values['noise_multiplier'])
  assert values['bands'] == '8'
  q, cycles = 50 * 8 / 4000, math.ceil(100 / 8)
  assert _amplified_epsilon(q, z, cycles, 1e-6) == pytest.approx(2.0, abs=1e-4)
  assert _amplified_epsilon(q, z * 0.99, cycles, 1e-6) > 2.0
  assert 'sensitivity=1.0' in out.stdout
