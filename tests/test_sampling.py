"""Tests for tff_dp.sampling: determinism in (seed, round), distribution, validation."""

import numpy as np
import pytest

from tff_dp import errors
from tff_dp import ledger
from tff_dp import sampling

IDS = [f'client_{i}' for i in range(500)]


def test_poisson_deterministic_per_seed_and_round():
  a = sampling.PoissonSampler(IDS, 0.05, seed=7)
  b = sampling.PoissonSampler(IDS, 0.05, seed=7)  # E.g. a resumed run.
  assert [b.sample(r) for r in (5, 3, 4)] == [a.sample(r) for r in (5, 3, 4)]
  assert a.sample(3) != a.sample(4)
  assert sampling.PoissonSampler(IDS, 0.05, seed=8).sample(3) != a.sample(3)
  assert all(c in IDS for c in a.sample(3))


def test_poisson_rate_and_empty_rounds():
  s = sampling.PoissonSampler(IDS, 0.05, seed=0)
  sizes = [len(s.sample(r)) for r in range(400)]
  # Mean of 400 Binomial(500, 0.05) draws: stddev sqrt(23.75 / 400) ~ 0.24.
  assert abs(np.mean(sizes) - 25.0) < 1.5
  tiny = sampling.PoissonSampler(IDS[:10], 0.01, seed=0)
  assert any(not tiny.sample(r) for r in range(50))  # Zero clients is a valid outcome.
  assert sampling.PoissonSampler(IDS, 1.0, seed=0).sample(1) == IDS


def test_fixed_size():
  s = sampling.FixedSizeSampler(IDS, 20, seed=3)
  picked = s.sample(10)
  assert len(picked) == 20 and len(set(picked)) == 20 and set(picked) <= set(IDS)
  assert picked == sampling.FixedSizeSampler(IDS, 20, seed=3).sample(10)
  assert picked != s.sample(11)
  assert sorted(sampling.FixedSizeSampler(IDS, 500, seed=3).sample(0)) == sorted(IDS)


def test_sampling_events():
  e = sampling.PoissonSampler(IDS, 0.05, seed=0).sampling_event()
  assert e == ledger.SamplingEvent('poisson', 500, probability=0.05, seeded=True)
  e = sampling.FixedSizeSampler(IDS, 20, seed=0).sampling_event()
  assert e == ledger.SamplingEvent('fixed_size', 500, sample_size=20, seeded=True)
  # Secret samples are not reproducible: a re-executed round is a fresh sample.
  assert not sampling.PoissonSampler(IDS, 0.05).sampling_event().seeded
  assert not sampling.FixedSizeSampler(IDS, 20).sampling_event().seeded
  assert sampling.ShuffledSampler(IDS, 20, seed=0).sampling_event(1).seeded
  assert not sampling.ShuffledSampler(IDS, 20).sampling_event(1).seeded


@pytest.mark.parametrize('make', [
    pytest.param(lambda: sampling.PoissonSampler(IDS, 0.0, 0), id='poisson_q_zero'),
    pytest.param(lambda: sampling.PoissonSampler(IDS, 1.5, 0), id='poisson_q_above_one'),
    pytest.param(lambda: sampling.PoissonSampler(IDS, float('nan'), 0), id='poisson_q_nan'),
    pytest.param(lambda: sampling.PoissonSampler(IDS, 'x', 0), id='poisson_q_not_a_number'),
    pytest.param(lambda: sampling.PoissonSampler([], 0.1, 0), id='poisson_no_clients'),
    pytest.param(lambda: sampling.PoissonSampler(['a', 'a'], 0.1, 0), id='poisson_duplicate_ids'),
    pytest.param(lambda: sampling.PoissonSampler(IDS, 0.1, -1), id='poisson_negative_seed'),
    pytest.param(lambda: sampling.FixedSizeSampler(IDS, 0, 0), id='fixed_size_zero'),
    pytest.param(lambda: sampling.FixedSizeSampler(IDS, 501, 0), id='fixed_size_above_population'),
    pytest.param(lambda: sampling.FixedSizeSampler(IDS, 2.5, 0), id='fixed_size_not_an_integer'),
    pytest.param(lambda: sampling.FixedSizeSampler(IDS, 5, 1.5), id='fixed_seed_not_an_integer'),
    pytest.param(lambda: sampling.FixedSizeSampler(IDS, 5, 0).sample(-1),
                 id='fixed_negative_round'),
])
def test_validation(make):
  with pytest.raises(errors.UserInputError):
    make()
