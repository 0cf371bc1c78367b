"""Lower bounds on epsilon from canary scores (issue 39, the bounds): against closed forms,
brute force, and Gaussian mechanisms of known epsilon whose scores are drawn here in numpy."""

import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats

from tff_dp.canaries import audit


def _binomial_tail(r, q, v):
  """P[Binomial(r, q) >= v] by summing the pmf (brute force)."""
  return sum(math.comb(r, k) * q**k * (1 - q)**(r - k) for k in range(v, r + 1))


def test_the_p_value_is_the_binomial_tail_plus_the_delta_term():
  for m, r, v, eps in ((50, 20, 15, 0.7), (200, 40, 40, 2.0), (10, 10, 6, 0.0)):
    q = 1 / (1 + math.exp(-eps))
    assert audit.one_run_p_value(m, r, v, eps, 0.0) == pytest.approx(_binomial_tail(r, q, v))
    spread = max(sum(math.comb(r, k) * q**k * (1 - q)**(r - k) for k in range(v - i, v)) / i
                 for i in range(1, v + 1))
    assert audit.one_run_p_value(m, r, v, eps, 1e-4) == pytest.approx(
        min(1.0, _binomial_tail(r, q, v) + 2 * m * 1e-4 * spread))


def test_the_fewest_canaries_that_can_give_a_bound():
  # delta = 0: all m guesses right has probability 2^-m under 0-DP; 2^-5 < 0.05 <= 2^-4.
  assert audit.min_canaries_for_a_bound(0.0) == 5
  fewest = audit.min_canaries_for_a_bound(1e-5)
  for m in (fewest - 1, fewest):   # Every canary guessed, every guess right.
    scores = np.arange(m, dtype=float)
    inserted = scores >= m // 2
    bound = audit.one_run_lower_bound(scores, inserted, 1e-5, int(inserted.sum()),
                                      int((~inserted).sum()))
    assert (bound > 0) == (m == fewest), (m, bound)


def test_abstention_counts_only_the_guesses():
  scores = np.array([0.9, 0.1, 0.5, 0.8, 0.2, 0.3])
  inserted = np.array([True, False, True, False, False, True])
  # Top 2 (0.9 in, 0.8 out), bottom 1 (0.1 out): 3 guesses, 2 right.
  assert audit.guesses(scores, inserted, 2, 1) == (3, 2)
  assert audit.guesses(scores, inserted, 0, 0) == (0, 0)


def test_perfect_separation_gives_larger_bounds_with_more_canaries():
  bounds = []
  for m in (20, 100, 1000):
    scores = np.arange(m, dtype=float)
    inserted = scores >= m / 2
    bounds.append(audit.one_run_lower_bound(scores, inserted, 1e-6, m // 2, m // 2))
  assert 0 < bounds[0] < bounds[1] < bounds[2]


def _gaussian_run(mu, m, rng):
  """A Gaussian mechanism with sensitivity mu (noise 1) seen through m canaries: each inserted
  with probability 1/2 shifts its score by mu."""
  inserted = rng.random(m) < 0.5
  return rng.normal(size=m) + mu * inserted, inserted


def _gaussian_epsilon(mu, delta):
  """The exact epsilon at delta of the Gaussian mechanism of sensitivity mu, noise 1 (Balle &
  Wang 2018, Theorem 8, solved for epsilon)."""
  excess = lambda e: (stats.norm.cdf(-e / mu + mu / 2)
                      - math.exp(e) * stats.norm.cdf(-e / mu - mu / 2) - delta)
  return optimize.brentq(excess, 0.0, 500.0)


def test_the_one_run_bound_stays_below_a_known_epsilon_and_is_not_vacuous():
  delta, mu = 1e-5, 1.0   # epsilon 4.38 at 1e-5.
  eps = _gaussian_epsilon(mu, delta)
  rng = np.random.default_rng(0)
  below = 0
  bounds = []
  for _ in range(20):
    scores, inserted = _gaussian_run(mu, 2000, rng)
    bound = audit.one_run_lower_bound(scores, inserted, delta, 100, 100)
    bounds.append(bound)
    below += bound <= eps
  assert below >= 18, (eps, bounds)    # At 95% confidence, 18 of 20 at least (binomial).
  assert np.median(bounds) > 0.25 * eps, (eps, bounds)


def test_an_under_noised_run_is_caught():
  """Noise at a quarter of what the claim assumed: the bound exceeds the claimed epsilon."""
  delta, claimed_mu = 1e-5, 0.25   # The claim: noise multiplier 4, epsilon 0.93 at 1e-5.
  claimed = _gaussian_epsilon(claimed_mu, delta)
  scores, inserted = _gaussian_run(4 * claimed_mu, 2000, np.random.default_rng(1))
  assert audit.one_run_lower_bound(scores, inserted, delta, 100, 100) > claimed


def test_clopper_pearson_against_its_closed_form_and_a_known_epsilon():
  n, confidence = 50, 0.95
  each = 1 - math.sqrt(confidence)
  # Perfect separation: TPR >= each^(1/n), FPR <= 1 - each^(1/n) (Beta(n, 1) and Beta(1, n)).
  bound = audit.clopper_pearson_lower_bound(np.ones(n), np.zeros(n), 0.5, 0.0, confidence)
  assert bound == pytest.approx(math.log(each**(1 / n) / (1 - each**(1 / n))))
  delta, mu = 1e-5, 3.0
  eps = _gaussian_epsilon(mu, delta)
  rng = np.random.default_rng(2)
  below = 0
  for _ in range(20):
    ins, out = rng.normal(size=500) + mu, rng.normal(size=500)
    threshold, ins_rest, out_rest = audit.split_threshold(ins, out, rng=rng)
    below += audit.clopper_pearson_lower_bound(ins_rest, out_rest, threshold, delta) <= eps
  assert below >= 18


def test_diagnostics_against_brute_force():
  rng = np.random.default_rng(3)
  ins, out = rng.normal(size=40) + 1, rng.normal(size=60)
  pairs = np.mean([[1.0 if a > b else 0.5 if a == b else 0.0 for b in out] for a in ins])
  assert audit.auroc(ins, out) == pytest.approx(pairs)
  threshold = np.sort(out)[-6]   # 5 of 60 above: FPR 1/12.
  assert audit.tpr_at_fpr(ins, out, 5 / 60) == pytest.approx(np.mean(ins > threshold))
