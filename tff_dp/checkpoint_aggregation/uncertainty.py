"""Uncertainty from the last k checkpoints of one DP run (Recycling Scraps, Sec. 5).

The paper uses the sample variance of a statistic f(theta) over the last k checkpoints of a
single run as a proxy for its variance over k independent runs (no extra privacy cost), e.g. for
test accuracy or for per-example prediction scores. We report the sample variance (ddof=1) and
Student-t intervals with k - 1 degrees of freedom, treating the k checkpoints as i.i.d. draws:
`ci_halfwidth` = t * s / sqrt(k) (interval for the mean over checkpoints) and
`prediction_halfwidth` = t * s * sqrt(1 + 1/k) (interval for one further draw, i.e. the spread a
single final model has). The paper finds these are reasonable *lower* bounds on the variance
measured with independent runs, since consecutive checkpoints are positively correlated.
"""

import json
import math
import os
from typing import Any, Optional, Sequence

import numpy as np
from scipy import stats

from tff_dp import atomic_write
from tff_dp.errors import UserInputError


def last_k_uncertainty(values: Any, confidence: float = 0.95) -> dict[str, Any]:
  """Mean, sample variance, std and Student-t half-widths over axis 0 of `values` ([k, ...]).

  For `values` of shape [k] (a scalar statistic per checkpoint) the results are Python floats.
  For [k, ...] (e.g. per-example scores) they are arrays of shape values.shape[1:], plus
  `summary` with means over all entries (`mean_variance` is the mean of the per-entry variances).
  """
  try:
    confidence = float(confidence)
  except (TypeError, ValueError):
    raise UserInputError(f'confidence must be a number in (0, 1), got {confidence!r}') from None
  if not 0.0 < confidence < 1.0:
    raise UserInputError(f'confidence must be in (0, 1), got {confidence}')
  values = np.asarray(values, dtype=np.float64)
  if values.ndim == 0:
    raise UserInputError('last-k uncertainty needs an array of shape [k, ...], got a scalar')
  k = values.shape[0]
  if k < 2:
    raise UserInputError(f'last-k uncertainty needs at least 2 checkpoints, got k={k}')
  if not np.all(np.isfinite(values)):
    raise UserInputError('last-k uncertainty: the values contain NaN or infinity')
  mean = values.mean(axis=0)
  variance = values.var(axis=0, ddof=1)
  std = np.sqrt(variance)
  t = float(stats.t.ppf(0.5 + confidence / 2.0, df=k - 1))
  ci = t * std / math.sqrt(k)
  pred = t * std * math.sqrt(1.0 + 1.0 / k)
  result: dict[str, Any] = {'k': int(k), 'confidence': confidence, 't_quantile': t}
  if values.ndim == 1:
    result.update(mean=float(mean), variance=float(variance), std=float(std),
                  ci_halfwidth=float(ci), prediction_halfwidth=float(pred))
    return result
  result.update(mean=mean, variance=variance, std=std, ci_halfwidth=ci,
                prediction_halfwidth=pred)
  result['summary'] = {
      'num_values': int(variance.size),
      'mean_variance': float(variance.mean()),
      'mean_std': float(std.mean()),
      'max_variance': float(variance.max()),
      'mean_ci_halfwidth': float(ci.mean()),
      'mean_prediction_halfwidth': float(pred.mean()),
  }
  return result


def _jsonable(x):
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return _jsonable(x.tolist())
  if isinstance(x, np.generic):
    return _jsonable(x.item())
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def _statistic_report(values: np.ndarray, confidence: float,
                      max_per_example_values: int) -> dict[str, Any]:
  """Report entry for one statistic; per-entry arrays only if small enough for JSON."""
  try:
    result = last_k_uncertainty(values, confidence)
  except UserInputError as e:
    return {'skipped': str(e)}
  if values.ndim == 1:
    result['values'] = values.tolist()
    return result
  entry = {key: result[key] for key in ('k', 'confidence', 't_quantile', 'summary')}
  entry['shape'] = list(values.shape[1:])
  if result['variance'].size <= max_per_example_values:
    entry['per_example'] = {key: result[key] for key in
                            ('mean', 'variance', 'std', 'ci_halfwidth', 'prediction_halfwidth')}
  else:
    entry['per_example'] = None
    entry['per_example_omitted'] = (f'{result["variance"].size} values > '
                                    f'max_per_example_values={max_per_example_values}')
  if values.ndim == 3 and values.shape[2] > 1:
    # Scores of the label each example is predicted as by the mean over checkpoints: the
    # quantity whose confidence widths the paper reports.
    labels = values.mean(axis=0).argmax(axis=-1)
    top = np.take_along_axis(values, labels[None, :, None], axis=2)[..., 0]
    top_entry = _statistic_report(top, confidence, max_per_example_values)
    if 'per_example' in top_entry and top_entry['per_example'] is not None:
      top_entry['per_example']['label'] = labels
    entry['predicted_label_score'] = top_entry
  return entry


def write_uncertainty_report(path: str, *, confidence: float = 0.95,
                             checkpoint_rounds: Optional[Sequence[int]] = None,
                             max_per_example_values: int = 10000,
                             metadata: Optional[dict[str, Any]] = None,
                             **statistics: Any) -> dict[str, Any]:
  """Writes last-k uncertainty of each statistic to JSON at `path`; returns the report.

  Each keyword in `statistics` maps a name to values over the last k checkpoints: shape [k] for
  a scalar (e.g. `accuracy=`), [k, n] or [k, n, classes] for per-example scores (e.g.
  `prediction_scores=`; with classes, the score of the predicted label is reported too).
  A statistic that cannot be assessed (k < 2, NaN) is recorded as `skipped` with the reason
  instead of failing the run. If `path` is a directory, writes `uncertainty.json` in it.
  """
  if not statistics:
    raise UserInputError('write_uncertainty_report needs at least one statistic')
  if os.path.isdir(path):
    path = os.path.join(path, 'uncertainty.json')
  report: dict[str, Any] = {
      'method': 'last-k checkpoints of one run (Recycling Scraps, Sec. 5): sample variance '
                '(ddof=1), Student-t intervals with k-1 degrees of freedom',
      'confidence': float(confidence),
  }
  if checkpoint_rounds is not None:
    report['checkpoint_rounds'] = [int(r) for r in checkpoint_rounds]
  if metadata:
    report['metadata'] = metadata
  report['statistics'] = {
      name: _statistic_report(np.asarray(v, dtype=np.float64), confidence,
                              max_per_example_values)
      for name, v in statistics.items()}
  report = _jsonable(report)
  with atomic_write.replacing(path) as f:
    json.dump(report, f, indent=1, allow_nan=False)
  return report
