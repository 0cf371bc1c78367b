"""Noise-cohort simulation (issue 28.1, 28.5): the noise a run adds, its projected production
epsilon against dp_accounting built here, the statement, and what is refused."""

import json
import math
import os

import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp import accounting
from tff_dp import ledger as ledger_lib
from tff_dp.accounting import noise_cohort
from tff_dp.aggregators import noise_feed
from tff_dp.training import config as config_lib
from tff_dp.training.builders import build_privacy
from tff_dp.training.run_state import privacy_recorder
from run_helpers import main_in_process
from test_correlated_noise import BASE
from test_matrix_factorization import _brute_force_sensitivity
from test_reproduce import _strategy_matrix

DIM, M_TRAINED, COHORT, Z, CLIP = 4000, 4, 100, 2.0, 0.5


@pytest.mark.parametrize('kind, extra', [
    ('fixed', {}), ('adaptive', {}), ('ftrl', {'rounds_per_epoch': 5}),
    ('blt', {'rounds_per_epoch': 5, 'total_rounds': 10})])
def test_the_noise_added_is_z_clip_m_over_big_m_on_the_sum(kind, extra):
  dp = config_lib.DPConfig(kind=kind, clip=CLIP, noise_multiplier=Z)
  factory = build_privacy.build_aggregator(dp, M_TRAINED, noise_scale=M_TRAINED / COHORT,
                                           **extra)
  process = factory.create(tff.to_type((np.float32, [DIM])))
  # Clients that send zero updates: the mean is the noise alone, sum noise / m.
  state = process.initialize()
  feed = noise_feed.for_factory(factory)   # ftrl, blt: fed from beside the process.
  if feed is not None:
    state = feed.into(state, 1)
  out = process.next(state, [np.zeros(DIM, np.float32)] * M_TRAINED)
  mean_noise = np.asarray(out.result)
  # The round's first noise is a fresh draw (tree leaf 1; BLT: C^-1's first coefficient is 1),
  # scaled for blt by the strategy's sensitivity: 10 rounds, 5 apart, at most twice.
  sensitivity = 1.0
  if kind == 'blt':
    sensitivity = math.sqrt(_brute_force_sensitivity(
        _strategy_matrix(factory.strategy, 10), 5, 2))
  z = Z * M_TRAINED / COHORT
  if kind == 'adaptive':
    # The clipped count takes its share (its production default max(M / 20, z), scaled by
    # m / M): the update query keeps z_v with z^-2 = z_v^-2 + (2 sigma_b)^-2.
    sigma_b = max(COHORT / 20, Z) * M_TRAINED / COHORT
    z = (z**-2 - (2 * sigma_b)**-2)**-0.5
  expected = z * CLIP * sensitivity / M_TRAINED
  # The std of DIM Gaussian draws is within 6% of sigma (about 5 of its standard errors).
  assert np.std(mean_noise) == pytest.approx(expected, rel=0.06)
  if kind == 'blt':
    assert sensitivity > 1.0


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_cohort_run_records_what_it_executed_and_projects_the_production_epsilon(
    tag_data_dir, tmp_path):
  root = tmp_path / 'runs'
  code, out, err = main_in_process('run_experiment.py', [
      a for a in BASE if not a.startswith('--client_sampling')] + [
      '--dp=fixed', '--noise_cohort_size=100', '--noise_population=1000000',
      f'--data_dir={tag_data_dir}', f'--root_output_dir={root}', '--experiment_name=c1',
      '--total_rounds=3', '--delta=1e-7'])   # Below 1 / the production population.
  assert code == 0, err[-2000:]
  run = root / 'c1'
  records = ledger_lib.read_ledger(str(run / 'ledger.jsonl'))
  # The ledger holds what ran: 20 clients, 4 expected per round, noise z x clip x 4 / 100.
  assert [r.sampling.probability for r in records] == pytest.approx([0.2] * 3)
  assert [r.queries[0].noise_stddev for r in records] == pytest.approx([1.0 * 0.5 * 0.04] * 3)
  with open(run / 'metrics.csv') as f:
    header, *lines = [line.strip().split(',') for line in f]
  col = lambda name: [float(v) if v else None for v in (x[header.index(name)] for x in lines)]
  for t, (own, projected) in enumerate(zip(col('epsilon_rdp'), col('projected_epsilon_rdp')),
                                       1):
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.2, dp_accounting.GaussianDpEvent(0.04)),
                t)
    assert own == pytest.approx(acc.get_epsilon(1e-7), rel=1e-6)
    production = dp_accounting.rdp.RdpAccountant()
    production.compose(dp_accounting.PoissonSampledDpEvent(
        100 / 1e6, dp_accounting.GaussianDpEvent(1.0)), t)
    assert projected == pytest.approx(production.get_epsilon(1e-7), rel=1e-6)
  pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
  pld.compose(dp_accounting.PoissonSampledDpEvent(1e-4, dp_accounting.GaussianDpEvent(1.0)), 3)
  assert col('projected_epsilon_pld')[-1] == pytest.approx(pld.get_epsilon(1e-7), rel=1e-6)
  privacy = json.loads((run / 'summary.json').read_text())['privacy']
  simulation = privacy['simulation']
  assert (simulation['noise_cohort_size'], simulation['noise_population']) == (100, 1000000)
  assert simulation['projected_epsilon']['rdp'] == col('projected_epsilon_rdp')[-1]
  assert 'not a guarantee' in simulation['note']
  # The headline is the run's own guarantee, far above the projection.
  assert privacy['epsilon']['rdp'] == col('epsilon_rdp')[-1] > 100 * col(
      'projected_epsilon_rdp')[-1]
  assert 'SIMULATION' in out   # The console names the column as the docs do (issue 37.9).
  assert f'projected_eps_rdp {col("projected_epsilon_rdp")[-1]:.4g}' in out, out
  assert (run / 'plots' / 'projected_epsilon_vs_round.png').exists()
  assert 'plots/projected_epsilon_vs_round.png' in ' '.join(privacy['covers'])
  # A noise cohort is a mechanism setting: a resume cannot change it.
  code, _, err = main_in_process('run_experiment.py', [
      f'--root_output_dir={root}', '--experiment_name=c1', '--resume', '--total_rounds=4',
      '--noise_cohort_size=200'])
  assert code == 2 and 'noise_cohort_size' in err, err[-2000:]


def test_tree_noise_is_projected_as_one_tree_per_production_epoch():
  cohort = noise_cohort.NoiseCohort(cohort_size=100, population=1000, clients_per_round=10)
  projection = privacy_recorder.Projection(
      cohort, accounting.LedgerAccountant(1e-6, ('rdp',), neighboring_relation='replace_special'),
      1e-6)
  # A simulation over 60 clients, 10 per round (epochs of 6 rounds), noise scaled by 1/10.
  for r in range(1, 26):
    event = ledger_lib.SamplingEvent('shuffled', 60, sample_size=10, epoch=(r - 1) // 6 + 1)
    projection.add(ledger_lib.RoundRecord(
        r, event, (ledger_lib.GaussianSumQuery('update', 1.0, 3.0 / 10),), (r - 1) % 6 + 1))
  # Production: 1000 // 100 = 10 rounds per epoch, so trees of 10, 10 and 5 leaves at z = 3.
  acc = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
  for leaves in (10, 10, 5):
    acc.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(3.0, leaves))
  assert projection.epsilons(is_last=True)['rdp'] == pytest.approx(acc.get_epsilon(1e-6),
                                                                   rel=1e-6)


@pytest.mark.parametrize('extra, message', [
    (['--noise_cohort_size=100'], 'go together'),
    (['--noise_cohort_size=2', '--noise_population=1000'], 'at least --clients_per_round'),
    (['--noise_cohort_size=100', '--noise_population=50'], 'at most --noise_population'),
    (['--noise_cohort_size=100', '--noise_population=1000', '--private_release'],
     '--private_release refuses --noise_cohort_size'),
    (['--noise_cohort_size=100', '--noise_population=1000', '--dp=none',
      '--noise_multiplier=0'], 'needs DP'),
    (['--noise_cohort_size=100', '--noise_population=1000', '--delta=1e-2'],
     'delta'),
    # The production run's cyclic Poisson rate, 100 x 2 groups / 150 > 1.
    (['--noise_cohort_size=100', '--noise_population=150', '--dp=bandmf',
      '--client_sampling=cyclic_poisson', '--bands=2'],
     '--noise_cohort_size=100 from 2 groups of --noise_population=150'),
])
def test_what_a_noise_cohort_cannot_do_is_refused_before_anything_is_written(
    extra, message, tag_data_dir, tmp_path):
  args = [a for a in BASE if not a.startswith(('--client_sampling', '--delta'))]
  code, _, err = main_in_process('run_experiment.py', args + ['--dp=fixed'] + extra + [
      f'--data_dir={tag_data_dir}', f'--root_output_dir={tmp_path / "runs"}'])
  assert code == 2 and message in err, err[-2000:]
  assert not os.path.exists(tmp_path / 'runs')
