"""The columns of metrics.csv, each declared once: its meaning, its unit, its role (what
readers look it up by) and whether the DP guarantee covers it.

The loop writes rows of these columns; the console line, the run's plots, the privacy statement,
`--private_release` and the paper tables find columns here by role (`names_with_role`) and
classify them here (`coverage`), instead of rediscovering a column's meaning from its name. A
column no entry declares is an error (`column` raises KeyError): a new metric is declared here
before a run may write it.

Some entries are families: `epsilon_<accountant>`, `eval_<metric>` and
`eval_<aggregate>_<metric>`, and `aggregator/<path>` (the model aggregator's measurements,
flattened; covered as the factory that reports each declares it, `RunFacts.measurements`).
"""

import dataclasses
import re
from typing import Iterable, Optional

from tff_dp import choices
from tff_dp import measurements
from tff_dp.canaries import scores as canary_scores
from tff_dp.run_format import classes

# Roles: what a reader looks a column up by.
CLIP = 'clip'                        # An L2 clip norm an update query used.
EPSILON = 'epsilon'                  # The proven epsilon after the round.
CANARY_EPSILON = 'canary_epsilon'    # An empirical (canary) estimate of epsilon.
CANARY_BOUND = 'canary_bound'        # A lower bound on epsilon from canary scores.
PROJECTED_EPSILON = 'projected_epsilon'   # A noise cohort's production epsilon (not this run's).
EVAL = 'eval'                        # A central evaluation metric.
OTHER = 'other'

# Coverage of evaluation columns: decided by the run (`RunFacts.eval_covered`).
EVAL_DATA = 'covered when the evaluation data is outside the protected population'
# Coverage of the aggregator's columns: as its factories declare (`RunFacts.measurements`).
DECLARED = 'covered as the factory that reports it declares'
AGGREGATOR = 'aggregator'


@dataclasses.dataclass(frozen=True)
class Column:
  """One column, or one family of columns (`pattern`, a regular expression when `family`)."""
  pattern: str
  meaning: str
  unit: str
  coverage: str                  # classes.COVERED, classes.DIAGNOSTIC, EVAL_DATA or DECLARED.
  role: str = OTHER
  family: bool = False

  def matches(self, name: str) -> bool:
    return re.fullmatch(self.pattern, name) is not None if self.family else name == self.pattern

  def kind(self, name: str, facts: classes.RunFacts) -> str:
    """COVERED or DIAGNOSTIC for column `name` in this run (without DP nothing is covered);
    KeyError for an aggregator measurement the run's factories do not declare."""
    kind = self.coverage
    if kind == EVAL_DATA:
      kind = classes.COVERED if facts.eval_covered else classes.DIAGNOSTIC
    if kind == DECLARED:
      covered = measurements.is_covered(facts.measurements, name.split('/')[1:])
      kind = classes.COVERED if covered else classes.DIAGNOSTIC
    return kind if facts.dp else classes.DIAGNOSTIC


# An L2 clip norm the aggregator reports, not the clipped-count query's (its role only).
_CLIP = r'(?!.*clipped_count)aggregator/(.+/)?[^/]*l2_norm_clip'
CANARY_FINAL_MODEL = 'canary_epsilon_final_model'
CANARY_ALL_ITERATES = 'canary_epsilon_all_iterates'
# The canary audit of an evaluation round (`tff_dp.canaries.audit.Audit`), per threat model:
# canary_<measure>_<final_model|all_iterates>.
CANARY_AUDIT = {
    'bound_one_run': ('95% lower bound on epsilon, one run (Steinke, Nasr & Jagielski 2023; '
                      'canaries inserted by coin)', CANARY_BOUND),
    'bound_clopper_pearson': ('95% lower bound on epsilon, threshold attack with '
                              'Clopper-Pearson intervals', CANARY_BOUND),
    'tpr_at_fpr_0.01': ('the attack\'s TPR at FPR 1e-2 (a diagnostic, not a bound)', OTHER),
    'tpr_at_fpr_0.001': ('the attack\'s TPR at FPR 1e-3 (a diagnostic, not a bound)', OTHER),
    'auroc': ('the attack\'s AUROC (a diagnostic, not a bound)', OTHER),
}
CANARY_THREAT_MODELS = canary_scores.THREAT_MODELS


def canary_audit_column(measure: str, threat_model: str) -> str:
  """The metrics column of canary audit `measure` (a `CANARY_AUDIT` key) for a threat model."""
  if measure not in CANARY_AUDIT or threat_model not in CANARY_THREAT_MODELS:
    raise KeyError(f'no canary audit column {measure!r} / {threat_model!r}')
  return f'canary_{measure}_{threat_model}'

COLUMNS = (
    Column('round', 'the round, from 1', 'round', classes.COVERED),
    Column('num_clients', 'clients in the round\'s sample', 'clients', classes.DIAGNOSTIC),
    Column('clients_rejected', 'sampled clients whose data could not be trained on', 'clients',
           classes.DIAGNOSTIC),
    Column('train_loss', 'the clients\' mean training loss', 'task loss', classes.DIAGNOSTIC),
    Column('train_accuracy', 'the clients\' mean training accuracy', 'fraction',
           classes.DIAGNOSTIC),
    Column('round_seconds', 'seconds of the TFF round (tracks the sample size)', 's',
           classes.DIAGNOSTIC),
    Column('wall_seconds', 'seconds of the whole round', 's', classes.DIAGNOSTIC),
    Column('canary_seconds', 'seconds of the canary bookkeeping', 's', classes.DIAGNOSTIC),
    Column('trained_from_aggregate', 'the next round starts from a checkpoint aggregate',
           'flag (1)', classes.COVERED),
    Column('epsilon_(' + '|'.join(choices.ACCOUNTANTS) + ')',
           'epsilon after the round at the run\'s delta, by accountant', 'epsilon',
           classes.COVERED, EPSILON, family=True),
    Column('projected_epsilon_(' + '|'.join(choices.ACCOUNTANTS) + ')',
           'noise cohort (`noise_cohort_size`): the epsilon a production run of that cohort '
           'from `noise_population` would have after the round, a projection that protects '
           'none of this run\'s clients', 'epsilon', classes.COVERED, PROJECTED_EPSILON,
           family=True),
    Column(CANARY_FINAL_MODEL, 'canary estimate of epsilon, final model',
           'epsilon', classes.COVERED, CANARY_EPSILON),
    Column(CANARY_ALL_ITERATES, 'canary estimate of epsilon, all iterates',
           'epsilon', classes.COVERED, CANARY_EPSILON),
    *(Column(canary_audit_column(measure, threat), f'{meaning}, {threat}',
             'epsilon' if role == CANARY_BOUND else 'fraction', classes.COVERED, role)
      for measure, (meaning, role) in CANARY_AUDIT.items() for threat in CANARY_THREAT_MODELS),
    Column(r'eval_.+', 'central evaluation of the round\'s model (eval_<metric>) or of a '
           'checkpoint aggregate (eval_<aggregate>_<metric>)', 'the metric\'s', EVAL_DATA, EVAL,
           family=True),
    # Most specific first: a clip norm is also an aggregator measurement.
    Column(_CLIP, 'the L2 clip norm of an update query (flat, per group or per layer)',
           'L2 norm', DECLARED, CLIP, family=True),
    Column(AGGREGATOR + r'/.+', 'a measurement of the model aggregator, as the factory that '
           'reports it declares it (tff_dp.measurements)', 'the measurement\'s', DECLARED,
           family=True),
)


def column(name: str) -> Column:
  """The declaration of column `name` (the first that matches); KeyError if none does."""
  for declared in COLUMNS:
    if declared.matches(name):
      return declared
  raise KeyError(f'metrics column {name!r} is not declared (tff_dp.run_format.columns)')


def coverage(name: str, facts: classes.RunFacts) -> str:
  """COVERED or DIAGNOSTIC for column `name` in a run with `facts`; KeyError if undeclared."""
  return column(name).kind(name, facts)


def names_with_role(names: Iterable[str], role: str) -> list[str]:
  """The names among `names` whose declared role is `role`, in their order (epsilon columns:
  in the accountants' order); undeclared names are skipped, so readers of older run
  directories see only what they know."""
  found = [n for n in names if _role(n) == role]
  if role == EPSILON:
    order = list(choices.ACCOUNTANTS)
    found.sort(key=lambda n: order.index(n[len('epsilon_'):]))
  return found


def _role(name: str) -> Optional[str]:
  try:
    return column(name).role
  except KeyError:
    return None
