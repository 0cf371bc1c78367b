"""What a run's outputs are, privacy-wise: the one classification every other piece derives from.

Every file a run writes, and every column of its metrics, is exactly one of:

* COVERED: an output of the DP mechanism or post-processing of such outputs (and of public
  data): the user-level guarantee the ledger states covers it, and it may be published.
* SECRET: something the operator must keep (noise state of correlated-noise mechanisms, keys and
  seeds that reproduce the samples, the canary key, the holdout key): publishing it voids the
  guarantee, or the amplification it relies on.
* DIAGNOSTIC: depends on client data without noise (sampled and rejected client counts, client
  training metrics, timings, evaluation on the protected users' own data): a non-private
  diagnostic for the operator.

Which class some outputs are in depends on the run (`RunFacts`): checkpoints hold the noise of
correlated-noise mechanisms (DP-FTRL's tree); evaluation is covered only on clients disjoint from
the protected population or on data declared public; config.json holds a sampling seed.

The privacy statement (`privacy_statement`), `private_release` (which columns a run writes, and
the `release/` folder it ships) and the test that walks a run directory all read `OUTPUTS`,
`classify_file` and `classify_column`; an output missing here is an error there, never silently
covered.
"""

import dataclasses
import fnmatch
import os
from typing import Callable, Optional, Union

COVERED = 'covered'
SECRET = 'secret'
DIAGNOSTIC = 'diagnostic'
CLASSES = (COVERED, SECRET, DIAGNOSTIC)

# The run directory's folder of secrets (mode 0700) and the publishable folder of a private
# release: names that say what they hold.
SECRET_DIR = 'secret'
RELEASE_DIR = 'release'


@dataclasses.dataclass(frozen=True)
class RunFacts:
  """What a run's classification depends on.

  dp: the run trains with DP (without, nothing is covered: there is no guarantee).
  noise_state_in_checkpoints: the mechanism's state holds its noise (tree aggregation: seeds and
    buffered noise), so a checkpoint and the released models together reveal the clipped sums.
  eval_covered: evaluation data is disjoint from the protected population or declared public.
  seeded: a sampling seed reproduces the samples (config.json records it).
  private_release: the run keeps diagnostics out of metrics.csv, TensorBoard and the console.
  """
  dp: bool = True
  noise_state_in_checkpoints: bool = False
  eval_covered: bool = False
  seeded: bool = False
  private_release: bool = False


_Rule = Union[str, Callable[[RunFacts], str]]


@dataclasses.dataclass(frozen=True)
class Output:
  """A file (glob, relative to the run directory) a run can write, what it holds, its class."""
  pattern: str
  holds: str
  rule: _Rule

  def kind(self, facts: RunFacts) -> str:
    kind = self.rule(facts) if callable(self.rule) else self.rule
    if not facts.dp and kind == COVERED:
      return DIAGNOSTIC   # No DP: nothing is covered by a guarantee.
    return kind


def _eval(facts: RunFacts) -> str:
  return COVERED if facts.eval_covered else DIAGNOSTIC


def _metrics(facts: RunFacts) -> str:
  # With private_release only covered columns are written (`released_columns`).
  return COVERED if facts.private_release else DIAGNOSTIC


def _settings(facts: RunFacts) -> str:
  return SECRET if facts.seeded else COVERED


OUTPUTS = (
    Output('config.json', 'every setting of the run (the sampling seed, if one was given)',
           _settings),
    Output('config_history.jsonl', 'the settings of each start and resume', _settings),
    Output('summary.json', 'the privacy statement and how the run ended', COVERED),
    Output('ledger.jsonl', 'the privacy ledger: the mechanism each round executed', COVERED),
    Output('ledger.unreleased.jsonl', 'ledger records of rounds that released nothing',
           COVERED),
    Output('ledger.jsonl.corrupt-*', 'a partial ledger line left by a crash', COVERED),
    Output('metrics.csv', 'one row per round (each column classified by classify_column)',
           _metrics),
    Output('metrics.superseded.csv', 'rows of rounds a resume re-executed', _metrics),
    Output('checkpoints/*', 'the model, optimizer and clip state after a round (no noise '
           'state)', lambda f: SECRET if f.noise_state_in_checkpoints else COVERED),
    Output(f'{SECRET_DIR}/checkpoints/*', 'checkpoints of a correlated-noise mechanism: its '
           'noise seeds and buffered noise', SECRET),
    Output(f'{SECRET_DIR}/sampling_key', 'the shuffled sampler\'s key (every epoch\'s order)',
           SECRET),
    Output(f'{SECRET_DIR}/canary_key', 'the key of the canary directions', SECRET),
    Output(f'{SECRET_DIR}/holdout_key', 'the key choosing the held-out evaluation clients',
           SECRET),
    Output('tensorboard/*', 'TensorBoard events: the metrics columns with wall-clock times',
           DIAGNOSTIC),
    Output('plots/epsilon_vs_round.png', 'epsilon after each round', COVERED),
    Output('plots/epsilon_estimated_vs_proven.png', 'canary estimates beside the bound',
           COVERED),
    Output('plots/clip_vs_round.png', 'the clip norm each round used', COVERED),
    Output('plots/accuracy_vs_epsilon.png', 'evaluation accuracy against epsilon', _eval),
    Output('plots/accuracy_vs_round.png', 'evaluation accuracy against rounds', _eval),
    Output('uncertainty.json', 'last-k uncertainty of evaluation (per-example scores and '
           'labels unless private_release)',
           lambda f: COVERED if f.private_release and f.eval_covered else DIAGNOSTIC),
    Output('.lock', 'the process id of the run\'s writer', DIAGNOSTIC),
    Output(f'{RELEASE_DIR}/*', 'the publishable set of a private release', COVERED),
)


def _match(relpath: str, pattern: str) -> bool:
  if pattern.endswith('/*'):   # A folder: everything below it.
    return relpath.startswith(pattern[:-1])
  return fnmatch.fnmatchcase(relpath, pattern)


def find_output(relpath: str) -> Optional[Output]:
  """The declared output `relpath` (relative to the run directory, '/'-separated), or None."""
  # The most specific pattern wins (secret/checkpoints/* before checkpoints/*).
  matches = [o for o in OUTPUTS if _match(relpath, o.pattern)]
  return max(matches, key=lambda o: len(o.pattern), default=None)


def classify_file(relpath: str, facts: RunFacts) -> str:
  """COVERED, SECRET or DIAGNOSTIC for a file of the run directory; KeyError for a file no
  output declares (a new output must be classified here before a run may write it)."""
  output = find_output(relpath)
  if output is None:
    raise KeyError(f'{relpath}: not a declared output of a run (tff_dp.training.release)')
  return output.kind(facts)


# Metrics columns (or prefixes) covered by the guarantee.
_COVERED_COLUMNS = ('round', 'trained_from_aggregate')
_COVERED_PREFIXES = ('epsilon_', 'canary_epsilon_')
EVAL_PREFIX = 'eval_'
# Measurement names of the DP aggregators (tff_dp.aggregators) whose values are computed from
# noised queries or from the pre-round (already released) query state.
_COVERED_AGGREGATOR_KEYS = frozenset({
    'privacy_queries', 'clip', 'next_clip', 'unclipped_fraction_estimate', 'dp_query_metrics',
    'scale', 'next_scale', 'tree_aggregation'})
# Columns that depend on client data without noise: what a round sampled and rejected, the
# clients' training metrics, timings; every other aggregator measurement (zeroed updates, ...).
DIAGNOSTIC_COLUMNS = {
    'num_clients': 'clients in the round\'s sample',
    'clients_rejected': 'sampled clients whose data could not be trained on',
    'train_loss': 'the clients\' mean training loss',
    'train_accuracy': 'the clients\' mean training accuracy',
    'round_seconds': 'seconds of the TFF round (tracks the sample size)',
    'wall_seconds': 'seconds of the whole round',
    'canary_seconds': 'seconds of the canary bookkeeping',
}
_AGGREGATOR_PREFIX = 'aggregator/'


def classify_column(name: str, facts: RunFacts) -> str:
  """COVERED or DIAGNOSTIC for metrics column `name`; KeyError for a column declared in neither
  list (a new metric is classified here before a run may write it). Aggregator measurements are
  covered by name (an allowlist): any other is a diagnostic."""
  if name in _COVERED_COLUMNS or name.startswith(_COVERED_PREFIXES):
    kind = COVERED
  elif name.startswith(EVAL_PREFIX):
    kind = _eval(facts)
  elif name.startswith(_AGGREGATOR_PREFIX):
    parts = name.split('/')[1:]
    kind = COVERED if any(p in _COVERED_AGGREGATOR_KEYS for p in parts) else DIAGNOSTIC
  elif name in DIAGNOSTIC_COLUMNS:
    kind = DIAGNOSTIC
  else:
    raise KeyError(f'metrics column {name!r} is not classified (tff_dp.training.release)')
  return kind if facts.dp else DIAGNOSTIC


def released_row(row: dict, facts: RunFacts) -> dict:
  """The part of a metrics row a run writes: all of it, or (private_release) covered columns."""
  if not facts.private_release:
    return dict(row)
  return {k: v for k, v in row.items() if classify_column(k, facts) == COVERED}


def outputs_of_class(kind: str, facts: RunFacts, files=None) -> list[str]:
  """'pattern: what it holds' of the declared outputs in class `kind` for this run; with
  `files` (paths relative to the run directory), only outputs among them."""
  return [f'{o.pattern}: {o.holds}' for o in OUTPUTS if o.kind(facts) == kind
          and (files is None or any(_match(f, o.pattern) for f in files))]


def run_files(run_path: str) -> list[str]:
  """The files of a run directory, relative to it, '/'-separated."""
  found = []
  for root, _, names in os.walk(run_path):
    for name in names:
      found.append(os.path.relpath(os.path.join(root, name), run_path).replace(os.sep, '/'))
  return sorted(found)
