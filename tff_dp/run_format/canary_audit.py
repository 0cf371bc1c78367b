"""The canary audit of an evaluation round as metrics columns: `audit.audit` of each threat
model's scores (`tff_dp.canaries.scores`), named as `columns.CANARY_AUDIT` declares. What a run
writes on each evaluation round and what `python -m tff_dp.canaries` recomputes from
canary_scores.csv are this one function.
"""

import numpy as np

from tff_dp.canaries import audit as audit_lib
from tff_dp.canaries import scores as scores_lib
from tff_dp.run_format import columns


def columns_of(found: scores_lib.Scores, delta: float, *, coin: bool, round_num: int,
               confidence: float = audit_lib.CONFIDENCE) -> dict[str, float]:
  """{metrics column: value} of `audit.audit` at `confidence` on each threat model's scores
  of round `round_num` (whose number seeds the Clopper-Pearson split)."""
  row = {}
  for threat in columns.CANARY_THREAT_MODELS:
    values = found.of(threat)
    if not np.all(np.isfinite(values)):   # All iterates before the first round.
      continue
    result = audit_lib.audit(values, found.inserted, delta, coin=coin, split_seed=round_num,
                             confidence=confidence)
    measures = {'bound_one_run': result.one_run, 'bound_clopper_pearson': result.clopper_pearson,
                'auroc': result.auroc}
    for fpr, tpr in zip(audit_lib.DIAGNOSTIC_FPRS, result.tpr_at_fpr):
      measures[f'tpr_at_fpr_{fpr:g}'] = tpr
    row.update({columns.canary_audit_column(m, threat): v for m, v in measures.items()
                if v is not None})
  return row
