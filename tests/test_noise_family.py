"""A kind of noise declared in a test plugs in without touching the package (issue 52): its
family (`noise_family.NoiseFamily`) with its account, its claim row and a mechanism of it
registered here are a `dp` choice, claimed, recorded under its name, accounted by its account
and stated. Oracle: dp_accounting built here (the toy accounts each round twice, so its epsilon
is that of twice the rounds)."""

import json
import os

import dp_accounting
import pytest

import tff_dp
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp import privacy
from tff_dp.accounting import accountant as accountant_lib
from tff_dp.accounting import claims
from tff_dp.accounting import gaussian_rounds
from tff_dp.accounting import noise_families
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib

TOY_NOISE, TOY_MECHANISM = 'toy_doubled', 'toy_doubled_fixed'
IDS = [f'c{i}' for i in range(100)]


class DoubledRounds(gaussian_rounds.GaussianRounds):
  """Each round composed twice: a conservative toy account."""
  name = 'doubled Gaussian rounds'

  def compose(self, record: ledger_lib.RoundRecord) -> None:
    super().compose(record)
    super().compose(record)


TOY_FAMILY = noise_families.NoiseFamily(
    name=TOY_NOISE, title='doubled toy noise',
    unproven_because='the toy is analysed with Poisson sampling only',
    statement='a toy ({dp}: each round accounted twice), as recorded in ledger.jsonl',
    account=DoubledRounds, carries_state=True, noise_in_round_queries=True)


@pytest.fixture
def toy_noise(monkeypatch):
  """The toy family, its claim row and a mechanism of it, registered as a user would (the
  registries restored afterwards)."""
  monkeypatch.setattr(claims, 'CLAIMS', list(claims.CLAIMS))
  monkeypatch.setattr(claims, '_BY_ROW', dict(claims._BY_ROW))  # pylint: disable=protected-access
  noise_families.register(TOY_FAMILY)
  claims.register(claims.Claim(
      TOY_NOISE, 'poisson', 'add_remove', 'twice the Poisson-subsampled Gaussian',
      amplified=True, attack='test_the_toy_is_accounted_twice', rate=claims.RATE_GIVEN))
  mechanisms.register(mechanisms.Mechanism(
      name=TOY_MECHANISM, description='fixed clip, each round accounted twice',
      noise=TOY_FAMILY, samplers=('poisson',),
      build_factory=mechanisms.MECHANISMS['fixed'].build_factory))
  yield
  del mechanisms.MECHANISMS[TOY_MECHANISM]
  del noise_families.FAMILIES[TOY_NOISE]


def _metrics(clip, stddev):
  return {'aggregator': {'privacy_queries': {'update': {'l2_norm_clip': clip,
                                                        'noise_stddev': stddev}}}}


def _doubled_epsilon(q, z, rounds, delta):
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)),
              2 * rounds)
  return acc.get_epsilon(delta)


def test_the_toy_is_accounted_twice_and_its_records_name_it(toy_noise, tmp_path):
  path = str(tmp_path / 'ledger.jsonl')
  private = privacy.PrivateAggregation.build(
      TOY_MECHANISM, IDS, clients_per_round=10, clip=1.0, noise_multiplier=1.2, delta=1e-5,
      sampling_probability=0.1, ledger_path=path)
  assert private.claim.noise == TOY_NOISE and private.claim.relation == 'add_remove'
  for r in range(1, 6):
    private.record(r, _metrics(1.0, 1.2))
  expected = _doubled_epsilon(0.1, 1.2, 5, 1e-5)
  assert private.statement()['epsilon']['rdp'] == pytest.approx(expected, rel=1e-9)
  with open(path) as f:
    assert [json.loads(line)['record']['noise'] for line in f] == [TOY_NOISE] * 5
  # Read back, the records name their family, and its account composes them.
  acc = accountant_lib.LedgerAccountant(1e-5, ('rdp',))
  for record in ledger_lib.read_ledger(path):
    acc.add(record)
  assert acc.epsilon_rdp() == pytest.approx(expected, rel=1e-9)
  # A round of the toy in a ledger of independent noise is another mechanism.
  fixed = ledger_lib.RoundRecord(6, private.sampler.sampling_event(6),
                                 (ledger_lib.GaussianSumQuery('update', 1.0, 1.2),))
  with pytest.raises(UserInputError, match='independent Gaussian noise in a ledger of doubled '
                                           'toy noise; one ledger holds one mechanism'):
    acc.add(fixed)


def test_the_toy_familys_rules_are_read_by_the_config_and_its_refusals(toy_noise):
  settings = dict(dp=TOY_MECHANISM, clip=1.0, noise_multiplier=1.0, sampling_probability=0.1)
  cfg = config_lib.ExperimentConfig.from_settings(**settings)
  assert cfg.rounds_per_checkpoint == 1   # Its state spans rounds.
  with pytest.raises(UserInputError, match='rerun_released_rounds` cannot apply'):
    config_lib.ExperimentConfig.from_settings(**settings, rerun_released_rounds=True,
                                              resume=True)
  # Its one row has a rate given before the data is seen.
  with pytest.raises(UserInputError, match='doubled toy noise with poisson sampling is proven '
                                           'only when its rate is given'):
    config_lib.ExperimentConfig.from_settings(dp=TOY_MECHANISM, clip=1.0, noise_multiplier=1.0)
  with pytest.raises(UserInputError, match='doubled toy noise has no proof with fixed_size '
                                           r'sampling \(the toy is analysed'):
    config_lib.ExperimentConfig.from_settings(dp=TOY_MECHANISM, clip=1.0, noise_multiplier=1.0,
                                              client_sampling='fixed_size')


def test_a_seeded_sample_of_a_family_without_that_analysis_is_refused(toy_noise):
  """The headline of a seeded run is against a seed holder (no amplification); the toy's
  account has no such bound, so its statement is refused rather than stated as another
  family's."""
  private = privacy.PrivateAggregation.build(
      TOY_MECHANISM, IDS, clients_per_round=10, clip=1.0, noise_multiplier=1.2, delta=1e-5,
      sampling_probability=0.1, sampling_seed=3)
  private.record(1, _metrics(1.0, 1.2))
  with pytest.raises(UserInputError, match='no analysis against a holder of the sampling seed'):
    private.statement()


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_run_of_the_toy_mechanism_is_recorded_accounted_and_stated(toy_noise, tmp_path):
  from test_user_task import TwoClassTask  # pylint: disable=g-import-not-at-top
  cfg = tff_dp.ExperimentConfig.from_settings(
      dp=TOY_MECHANISM, clip=1.0, noise_multiplier=1.0, clients_per_round=4,
      sampling_probability=0.25, total_rounds=2, accounting=['rdp'], delta=1e-3,
      root_output_dir=str(tmp_path / 'runs'))
  summary = tff_dp.run(cfg, task=TwoClassTask())
  assert summary.rounds_completed == 2
  assert summary.privacy['epsilon']['rdp'] == pytest.approx(
      _doubled_epsilon(0.25, 1.0, 2, 1e-3), rel=1e-6)
  with open(os.path.join(summary.run_dir, 'ledger.jsonl')) as f:
    assert [json.loads(line)['record']['noise'] for line in f] == [TOY_NOISE] * 2
  # Its noise state spans rounds (`carries_state`): every round is checkpointed, as a secret.
  assert sorted(os.listdir(os.path.join(summary.run_dir, 'secret', 'checkpoints'))) == [
      'round_1', 'round_2']
  assert not os.path.exists(os.path.join(summary.run_dir, 'checkpoints'))
  with open(os.path.join(summary.run_dir, 'summary.json')) as f:
    assert 'a toy (toy_doubled_fixed: each round accounted twice)' in json.load(f)[
        'privacy']['mechanism']


def test_a_row_its_samplers_declaration_contradicts_is_refused(monkeypatch):
  """A row of independent noise is composed by the sampler's `independent_event`: a sampler
  that declares none cannot have one (it failed deep in the accountant before)."""
  monkeypatch.setattr(claims, 'CLAIMS', list(claims.CLAIMS))
  monkeypatch.setattr(claims, '_BY_ROW', dict(claims._BY_ROW))  # pylint: disable=protected-access
  with pytest.raises(ValueError, match='declares no independent_event'):
    claims.register(claims.Claim(claims.INDEPENDENT_NOISE, 'shuffled', claims.ZERO_OUT,
                                 'none', amplified=False, attack='none'))
  with pytest.raises(ValueError, match='rate disagrees with its sampler'):
    claims.register(claims.Claim(TOY_NOISE, 'shuffled', claims.ZERO_OUT, 'none',
                                 amplified=False, attack='none', rate=claims.RATE_GIVEN))
  with pytest.raises(ValueError, match='has a row for'):
    claims.register(claims.CLAIMS[0])
