"""`tff_dp.privacy.PrivateAggregation` (issue 38, item 3): the aggregator of a user's own TFF loop
bound to its proven sampler, its accountant and a ledger; epsilons against dp_accounting built
here. (docs/PYTHON_API.md runs it inside TFF's own FedAvg: tests/test_readme.py.)"""

import math

import dp_accounting
import pytest

from tff_dp import ledger as ledger_lib
from tff_dp import privacy
from tff_dp.errors import UserInputError

IDS = [f'c{i}' for i in range(100)]


def _metrics(clip, stddev):
  """What a DP factory reports in a process's output metrics (Contract 1)."""
  return {'aggregator': {'privacy_queries': {'update': {'l2_norm_clip': clip,
                                                        'noise_stddev': stddev}}}}


def test_poisson_records_account_and_state_the_proven_relation(tmp_path):
  key = ledger_lib.new_mac_key()
  private = privacy.PrivateAggregation.build(
      'fixed', IDS, clients_per_round=10, clip=1.0, noise_multiplier=1.2, delta=1e-5,
      sampling_probability=0.1, ledger_path=str(tmp_path / 'ledger.jsonl'), ledger_key=key,
      ledger_seal_path=str(tmp_path / 'seal'))
  assert private.sampler.secret and private.claim.relation == 'add_remove'
  for r in range(1, 6):
    assert len(set(private.sample(r))) == len(private.sample(r))
    private.record(r, _metrics(1.0, 1.2))
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.2)), 5)
  statement = private.statement()
  assert statement['epsilon']['rdp'] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
  assert private.epsilon() == statement['epsilon']
  assert statement['relation'] == 'add/remove-one' and 'Mironov' in statement['proof']
  assert len(ledger_lib.read_ledger(str(tmp_path / 'ledger.jsonl'), mac_key=key,
                                    seal_path=str(tmp_path / 'seal'))) == 5


def test_a_rate_derived_from_the_population_states_zero_out_with_the_same_epsilon():
  """q = clients_per_round / N: an add/remove neighbour would run with another q, so the
  claim is zero-out; its epsilon is the add/remove one at that q (dp_accounting here)."""
  private = privacy.PrivateAggregation.build(
      'fixed', IDS, clients_per_round=10, clip=1.0, noise_multiplier=1.2, delta=1e-5)
  for r in range(1, 6):
    private.record(r, _metrics(1.0, 1.2))
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.2)), 5)
  statement = private.statement()
  assert statement['neighboring_relation'] == 'replace_special'
  assert statement['sampling_rate'] == 'm / N'
  assert private.epsilon()['rdp'] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)


def test_a_seeded_sample_headlines_the_epsilon_against_the_seed_holder():
  private = privacy.PrivateAggregation.build(
      'fixed', IDS, clients_per_round=10, clip=1.0, noise_multiplier=4.0, delta=1e-5,
      sampling_seed=3)
  for r in range(1, 5):
    private.record(r, _metrics(1.0, 4.0))
  statement = private.statement()
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.GaussianDpEvent(4.0 / math.sqrt(4)))   # Four known releases.
  assert statement['epsilon']['rdp'] == pytest.approx(acc.get_epsilon(1e-5), rel=1e-9)
  assert statement['epsilon_if_seed_secret']['rdp'] < statement['epsilon']['rdp']


def test_an_unproven_sampler_is_refused_and_correlated_noise_needs_its_rounds():
  with pytest.raises(UserInputError, match='has no proof with poisson sampling'):
    privacy.PrivateAggregation.build('blt', IDS, clients_per_round=10, clip=1.0,
                                     noise_multiplier=1.0, delta=1e-5, rounds=5,
                                     sampling_kind='poisson')
  with pytest.raises(UserInputError, match='give `rounds`'):
    privacy.PrivateAggregation.build('bandmf', IDS, clients_per_round=10, clip=1.0,
                                     noise_multiplier=1.0, delta=1e-5)
  with pytest.raises(UserInputError, match='`kind` must be one of'):
    privacy.PrivateAggregation.build('none', IDS, clients_per_round=10, clip=1.0,
                                     noise_multiplier=1.0, delta=1e-5)


def test_record_refuses_a_skipped_or_repeated_round_and_another_processes_noise():
  private = privacy.PrivateAggregation.build(
      'fixed', IDS, clients_per_round=10, clip=1.0, noise_multiplier=1.2, delta=1e-5)
  with pytest.raises(UserInputError, match='the next is round 1'):
    private.record(2, _metrics(1.0, 1.2))
  private.record(1, _metrics(1.0, 1.2))
  with pytest.raises(UserInputError, match='the next is round 2'):
    private.record(1, _metrics(1.0, 1.2))   # Recorded twice: stated as one round.
  with pytest.raises(UserInputError, match='multiplier 3.6'):
    private.record(2, _metrics(1.0, 3.6))   # Three times the noise the factory adds.
  private.record(2, _metrics(0.5, 0.6000000238418579))   # float32 of z x clip: accepted.
  assert len(private.records) == 2


def test_build_refuses_a_delta_of_one_over_the_population_or_more():
  with pytest.raises(UserInputError, match='delta'):
    privacy.PrivateAggregation.build('fixed', IDS, clients_per_round=10, clip=1.0,
                                     noise_multiplier=1.2, delta=1 / len(IDS))
