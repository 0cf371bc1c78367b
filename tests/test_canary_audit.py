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


# --- what a run reports (issue 39, items 1-3 and 5) ------------------------------------------

def test_the_guesses_are_declared_and_the_union_bound_pays_for_taking_the_best():
  rng = np.random.default_rng(5)
  inserted = rng.random(400) < 0.5
  scores = rng.normal(size=400) + 2.0 * inserted
  each = 1 - 0.05 / len(audit.ONE_RUN_GUESS_FRACTIONS)
  by_k = [audit.one_run_lower_bound(scores, inserted, 1e-5, k, k, each) for k in (20, 40, 80)]
  assert audit.one_run_bound_over_guesses(scores, inserted, 1e-5) == max(by_k)
  # Each guess at 95% alone would claim more than the union bound allows.
  assert max(audit.one_run_lower_bound(scores, inserted, 1e-5, k, k, 0.95)
             for k in (20, 40, 80)) > max(by_k)


def test_below_the_fewest_canaries_no_one_run_bound_is_reported():
  fewest = audit.min_canaries_for_a_bound_over_guesses(1e-5)
  for m in (fewest - 1, fewest):   # Perfectly separated scores: the best any run can do.
    inserted = np.arange(m) % 2 == 0
    scores = inserted.astype(float) + np.arange(m) * 1e-6
    result = audit.audit(scores, inserted, 1e-5, coin=True, split_seed=0)
    assert (result.one_run is not None and result.one_run > 0) == (m == fewest), (m, result)
    bound_by_hand = max(audit.one_run_lower_bound(
        scores, inserted, 1e-5, k, k, 1 - 0.05 / 3) for k in {max(1, min(m // 2, round(f * m)))
                                                              for f in (0.05, 0.1, 0.2)})
    assert (bound_by_hand > 0) == (m == fewest)
  rng = np.random.default_rng(0)
  inserted = rng.random(500) < 0.5
  scores = rng.normal(size=500) + 3 * inserted
  assert audit.audit(scores, inserted, 1e-5, coin=False, split_seed=0).one_run is None
  assert audit.audit(scores, inserted, 1e-5, coin=True, split_seed=0).one_run > 1


def test_coin_inclusion_inserts_each_canary_with_probability_one_half():
  from tff_dp import canaries  # pylint: disable=g-import-not-at-top
  m, seeds = 4, 4000
  counts = np.bincount([canaries.coin_inserted(m, seed=s) for s in range(seeds)],
                       minlength=m + 1)
  expected = np.array([math.comb(m, k) for k in range(m + 1)]) / 2**m * seeds
  assert stats.chisquare(counts, expected).pvalue > 1e-3, counts
  key = canaries.new_key()
  assert canaries.coin_inserted(50, key=key) == canaries.coin_inserted(50, key=key)


def test_scores_are_kept_per_round_and_a_resume_drops_the_rounds_after_its_checkpoint(
    tmp_path):
  from tff_dp.canaries import scores  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / scores.FILE)
  written = {r: scores.Scores(np.array([True, False, True]), np.array([0.1, -0.2, 0.3]) * r,
                              np.array([0.5, 0.25, 1 / 3]) * r) for r in (2, 4, 6)}
  for r, s in written.items():
    scores.append(path, r, s)
  read = scores.read(path)
  assert list(read) == [2, 4, 6]
  for r in written:   # Exact floats (repr), inserted flags as written.
    assert np.array_equal(read[r].inserted, written[r].inserted)
    assert np.array_equal(read[r].final_model, written[r].final_model)
    assert np.array_equal(read[r].all_iterates, written[r].all_iterates)
  scores.keep_through(path, 4)
  assert list(scores.read(path)) == [2, 4]
  # Issue 51, item 4: a file that is not whole is refused, never read as partial data.
  whole = open(path).read()
  for cut, message in ((whole[:len(whole) // 2], 'not whole'),
                       (whole.splitlines(keepends=True)[0], 'holds no scores'),
                       (''.join(whole.splitlines(keepends=True)[:-1]), 'not whole')):
    with open(path, 'w') as f:
      f.write(cut)
    with pytest.raises(ValueError, match=message):
      scores.read(path)
  with open(path, 'w') as f:
    f.write(whole)
  with pytest.raises(ValueError, match='not whole'):
    scores.read(path, canaries=4)


def test_every_audit_column_is_declared_and_covered():
  from tff_dp.canaries import scores  # pylint: disable=g-import-not-at-top
  from tff_dp.run_format import canary_audit  # pylint: disable=g-import-not-at-top
  from tff_dp.run_format import classes  # pylint: disable=g-import-not-at-top
  from tff_dp.run_format import columns  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  inserted = rng.random(300) < 0.5
  found = scores.Scores(inserted, rng.normal(size=300) + inserted, rng.normal(size=300))
  row = canary_audit.columns_of(found, 1e-5, coin=True, round_num=3)
  assert len(row) == 10   # 2 bounds + 3 diagnostics, 2 threat models.
  facts = classes.RunFacts(dp=True, noise_state_in_checkpoints=False, eval_covered=True,
                           seeded=False, private_release=False)
  assert all(columns.coverage(name, facts) == classes.COVERED for name in row)
  bounds = columns.names_with_role(row, columns.CANARY_BOUND)
  assert sorted(bounds) == sorted(f'canary_bound_{k}_{t}' for k in ('one_run',
                                                                    'clopper_pearson')
                                  for t in ('final_model', 'all_iterates'))
  assert row['canary_bound_one_run_final_model'] == audit.one_run_bound_over_guesses(
      found.final_model, inserted, 1e-5)
