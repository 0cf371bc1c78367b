"""Lower bounds on epsilon from canary scores, with stated confidence (numpy / scipy only).

A canary estimate (`estimate`) is a heuristic with no guarantee; these are bounds: if the run
were (epsilon, delta)-DP for an epsilon below the bound, scores this separable would have
appeared with probability at most 1 - confidence. So "the lower bound exceeds the proven
epsilon" is evidence of a bug, and "it does not" says nothing more than that.

* `one_run_lower_bound`: Steinke, Nasr & Jagielski (NeurIPS 2023), "Privacy Auditing with One
  (1) Training Run", Theorem 3.1 / Appendix D. Each of m canaries is inserted independently
  with probability 1/2; the auditor guesses "inserted" for the k_plus highest scores and "not
  inserted" for the k_minus lowest, and abstains on the rest. Under (epsilon, delta)-DP the
  number of correct guesses v out of r exceeds a Binomial(r, e^eps / (1 + e^eps)) tail only
  by a term 2 m delta max_i P[v - i <= Bin < v] / i; the bound is the largest epsilon whose
  p-value is below 1 - confidence.
* `clopper_pearson_lower_bound`: a threshold attack on inserted against held-out scores, with
  exact (Clopper-Pearson) one-sided intervals on its TPR and FPR: epsilon >= log((TPR_lo -
  delta) / FPR_hi), each interval at sqrt(confidence) so that both hold together. The threshold
  must not be chosen on the same scores (`split_threshold` picks it on a held-out split).
* `tpr_at_fpr`, `auroc`: diagnostics of the attack, not bounds.
* `audit`: all of these for one set of scores, with guesses and split declared in advance (what
  a run reports on each evaluation round, and `python -m tff_dp.canaries` recomputes).
"""

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np
from scipy import stats

from tff_dp.errors import UserInputError


# The confidence a run states its lower bounds at (`python -m tff_dp.canaries` takes others).
CONFIDENCE = 0.95


def _check_confidence(confidence: float) -> float:
  if not 0 < confidence < 1:
    raise UserInputError(f'`confidence` must be in (0, 1), got {confidence!r}')
  return float(confidence)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
  """P[at least v of r guesses are correct] for an (epsilon, delta)-DP run with m canaries
  (each inserted with probability 1/2): the paper's bound on that probability."""
  if not 0 <= v <= r <= m:
    raise UserInputError(f'need 0 <= v <= r <= m, got v={v}, r={r}, m={m}')
  q = 1.0 / (1.0 + math.exp(-epsilon))   # Accuracy of epsilon-DP randomized response.
  tail = stats.binom.sf(v - 1, r, q)
  if delta == 0 or v == 0:
    return float(min(tail, 1.0))
  # P[v - i <= Bin(r, q) < v] for i = 1..v, divided by i: its largest value.
  below = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)
  spread = float(np.max(np.cumsum(below) / np.arange(1, v + 1)))
  return float(min(tail + 2.0 * m * delta * spread, 1.0))


def _largest_epsilon(p_value, confidence: float, high: float = 1.0) -> float:
  """The largest epsilon with p_value(epsilon) < 1 - confidence (0 if none), by bisection:
  p_value decreases in epsilon."""
  alpha = 1.0 - confidence
  if p_value(0.0) >= alpha:
    return 0.0
  while p_value(high) < alpha:
    high *= 2
    if high > 1e3:
      return math.inf
  low = 0.0
  for _ in range(60):
    mid = 0.5 * (low + high)
    if p_value(mid) < alpha:
      low = mid
    else:
      high = mid
  return low


def guesses(scores: Sequence[float], inserted: Sequence[bool], k_plus: int,
            k_minus: int) -> tuple[int, int]:
  """(r guesses made, v correct): "inserted" for the k_plus highest scores, "not inserted"
  for the k_minus lowest, abstaining on the rest."""
  scores, inserted = np.asarray(scores, float), np.asarray(inserted, bool)
  if scores.shape != inserted.shape or scores.ndim != 1:
    raise UserInputError('scores and inserted must be vectors of equal length')
  if k_plus < 0 or k_minus < 0 or k_plus + k_minus > scores.size:
    raise UserInputError(f'k_plus + k_minus must be in [0, {scores.size}]')
  order = np.argsort(scores, kind='stable')
  low, high = order[:k_minus], order[scores.size - k_plus:]
  return k_plus + k_minus, int(inserted[high].sum() + (~inserted[low]).sum())


def one_run_lower_bound(scores: Sequence[float], inserted: Sequence[bool], delta: float,
                        k_plus: int, k_minus: int, confidence: float = CONFIDENCE) -> float:
  """The one-run lower bound on epsilon at `confidence`, for guesses on the top `k_plus` and
  bottom `k_minus` scores (chosen before looking at which canaries were inserted)."""
  confidence = _check_confidence(confidence)
  m = len(scores)
  r, v = guesses(scores, inserted, k_plus, k_minus)
  return _largest_epsilon(lambda e: one_run_p_value(m, r, v, e, delta), confidence)


def min_canaries_for_a_bound(delta: float, confidence: float = CONFIDENCE) -> int:
  """The fewest canaries with which a one-run bound can exceed 0 at all: every canary guessed
  and every guess right (below it, any run, however leaky, gets the bound 0)."""
  confidence = _check_confidence(confidence)
  m = 1
  while one_run_p_value(m, m, m, 0.0, delta) >= 1.0 - confidence:
    m += 1
    if m > 10**5:
      raise UserInputError(f'no number of canaries gives a bound at delta {delta}')
  return m


def clopper_pearson_lower_bound(inserted_scores: Sequence[float],
                                held_out_scores: Sequence[float], threshold: float,
                                delta: float, confidence: float = CONFIDENCE) -> float:
  """Lower bound on epsilon from the attack "score > threshold means inserted": exact
  one-sided bounds on its TPR (below) and FPR (above), each at sqrt(confidence)."""
  confidence = _check_confidence(confidence)
  each = 1.0 - math.sqrt(confidence)
  ins, out = np.asarray(inserted_scores, float), np.asarray(held_out_scores, float)
  if ins.size == 0 or out.size == 0:
    raise UserInputError('need inserted and held-out scores')
  tp, fp = int((ins > threshold).sum()), int((out > threshold).sum())
  tpr_low = stats.beta.ppf(each, tp, ins.size - tp + 1) if tp > 0 else 0.0
  fpr_high = stats.beta.ppf(1 - each, fp + 1, out.size - fp) if fp < out.size else 1.0
  if tpr_low - delta <= 0 or fpr_high <= 0:
    return 0.0
  return max(0.0, float(math.log((tpr_low - delta) / fpr_high)))


def split_threshold(inserted_scores, held_out_scores, fraction: float = 0.5,
                    rng: Optional[np.random.Generator] = None):
  """(threshold, inserted scores left, held-out scores left): the threshold that separates a
  random `fraction` of each best (largest TPR - FPR), chosen on that part only, so that the
  Clopper-Pearson bound on the rest keeps its confidence."""
  rng = rng if rng is not None else np.random.default_rng()
  ins, out = (rng.permutation(np.asarray(x, float)) for x in (inserted_scores, held_out_scores))
  ni, no = int(len(ins) * fraction), int(len(out) * fraction)
  if min(ni, no, len(ins) - ni, len(out) - no) < 1:
    raise UserInputError('too few scores to split into a threshold part and a bound part')
  candidates = np.unique(np.concatenate([ins[:ni], out[:no]]))
  gain = [(ins[:ni] > t).mean() - (out[:no] > t).mean() for t in candidates]
  return float(candidates[int(np.argmax(gain))]), ins[ni:], out[no:]


def tpr_at_fpr(inserted_scores, held_out_scores, fpr: float) -> float:
  """The attack's TPR at the threshold where at most `fpr` of held-out scores exceed it."""
  ins, out = np.asarray(inserted_scores, float), np.sort(np.asarray(held_out_scores, float))
  allowed = int(math.floor(fpr * out.size + 1e-9))   # Held-out scores that may exceed it.
  threshold = out[out.size - allowed - 1] if allowed < out.size else -math.inf
  return float((ins > threshold).mean())


def auroc(inserted_scores, held_out_scores) -> float:
  """P[an inserted score exceeds a held-out one] (ties count half): the Mann-Whitney AUC."""
  ins, out = np.asarray(inserted_scores, float), np.asarray(held_out_scores, float)
  ranks = stats.rankdata(np.concatenate([ins, out]))
  return float((ranks[:ins.size].sum() - ins.size * (ins.size + 1) / 2) / (ins.size * out.size))


# The guesses of a one-run bound, declared before any score is seen: "inserted" for the top k
# and "not inserted" for the bottom k scores, k = each fraction of the canaries; the bound is
# the largest over these, each at confidence 1 - (1 - confidence) / 3 (a union bound), so the
# stated confidence holds for the maximum.
ONE_RUN_GUESS_FRACTIONS = (0.05, 0.1, 0.2)
DIAGNOSTIC_FPRS = (1e-2, 1e-3)


@dataclasses.dataclass(frozen=True)
class Audit:
  """What one set of canary scores says: two lower bounds on epsilon at `confidence` (None when
  the canaries cannot give one: too few, or not inserted by coin for the one-run bound) and the
  attack's diagnostics (TPR at each of `DIAGNOSTIC_FPRS`, AUROC), which bound nothing."""
  one_run: Optional[float]
  clopper_pearson: Optional[float]
  tpr_at_fpr: tuple
  auroc: float


def one_run_bound_over_guesses(scores, inserted, delta: float,
                               confidence: float = CONFIDENCE) -> float:
  """The one-run lower bound with the pre-declared guesses of `ONE_RUN_GUESS_FRACTIONS`."""
  confidence = _check_confidence(confidence)
  each = 1.0 - (1.0 - confidence) / len(ONE_RUN_GUESS_FRACTIONS)
  return max(one_run_lower_bound(scores, inserted, delta, k, k, each)
             for k in _guess_counts(len(scores)))


def _guess_counts(m: int) -> list[int]:
  return sorted({max(1, min(m // 2, int(round(f * m)))) for f in ONE_RUN_GUESS_FRACTIONS})


def min_canaries_for_a_bound_over_guesses(delta: float,
                                          confidence: float = CONFIDENCE) -> int:
  """The fewest canaries with which `one_run_bound_over_guesses` can exceed 0: its widest
  guess (2k of m) all right. Below it a run reports no one-run bound."""
  confidence = _check_confidence(confidence)
  alpha = (1.0 - confidence) / len(ONE_RUN_GUESS_FRACTIONS)
  for m in range(2, 10**5):
    r = 2 * max(_guess_counts(m))
    if one_run_p_value(m, r, r, 0.0, delta) < alpha:
      return m
  raise UserInputError(f'no number of canaries gives a bound at delta {delta}')


def audit(scores, inserted, delta: float, *, coin: bool, split_seed: int,
          confidence: float = CONFIDENCE) -> Audit:
  """The bounds and diagnostics of canary `scores` (higher: more likely inserted), `inserted`
  saying which canaries were. `coin`: each canary was inserted by its own fair coin (else no
  one-run bound). `split_seed` picks the Clopper-Pearson threshold's half of the canaries
  (fixed before the scores exist, e.g. the round's number)."""
  scores, inserted = np.asarray(scores, float), np.asarray(inserted, bool)
  ins, out = scores[inserted], scores[~inserted]
  one_run = None
  if coin and scores.size >= min_canaries_for_a_bound_over_guesses(delta, confidence):
    one_run = one_run_bound_over_guesses(scores, inserted, delta, confidence)
  cp = None
  if min(ins.size, out.size) >= 2:
    threshold, ins_rest, out_rest = split_threshold(ins, out,
                                                    rng=np.random.default_rng(split_seed))
    cp = clopper_pearson_lower_bound(ins_rest, out_rest, threshold, delta, confidence)
  if ins.size == 0 or out.size == 0:
    return Audit(one_run, cp, tuple(math.nan for _ in DIAGNOSTIC_FPRS), math.nan)
  return Audit(one_run, cp, tuple(tpr_at_fpr(ins, out, f) for f in DIAGNOSTIC_FPRS),
               auroc(ins, out))
