"""What a run's outputs are, privacy-wise: every file a run can write, and its class
(`classes`: covered, secret or a non-private diagnostic); every metrics column is declared in
`columns`. The one classification every other piece derives from.

Which class some outputs are in depends on the run (`classes.RunFacts`): checkpoints hold the
noise of correlated-noise mechanisms (DP-FTRL's tree); evaluation is covered only on clients
disjoint from the protected population or on data declared public; config.json holds a
sampling seed.

The privacy statement (`tff_dp.training.report.privacy_statement`), `private_release` (which
columns a run writes, and the `release/` folder it ships) and the test that walks a run
directory all read `OUTPUTS`, `classify_file` and `classify_column`; an output missing here is an
error there, never silently covered.
"""

import dataclasses
import fnmatch
import os
from typing import Callable, Optional, Union

from tff_dp import run_format
from tff_dp.canaries import scores as canary_scores
from tff_dp.run_format import classes
from tff_dp.run_format import columns

# The classes and the facts they depend on, under the names every reader uses.
COVERED, SECRET, DIAGNOSTIC, CLASSES = (classes.COVERED, classes.SECRET, classes.DIAGNOSTIC,
                                        classes.CLASSES)
RunFacts = classes.RunFacts

# The run directory's folder of secrets (mode 0700) and the publishable folder of a private
# release: names that say what they hold.
SECRET_DIR = run_format.SECRET_FOLDER
RELEASE_DIR = 'release'


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
    Output(run_format.CONFIG_FILE, 'every setting of the run (the sampling seed, if one was given)',
           _settings),
    Output(run_format.CONFIG_HISTORY_FILE, 'the settings of each start and resume', _settings),
    Output(run_format.SUMMARY_FILE, 'the privacy statement and how the run ended', COVERED),
    Output(run_format.LEDGER_FILE, 'the privacy ledger: the mechanism each round executed', COVERED),
    Output(run_format.UNRELEASED_LEDGER_FILE, 'ledger records of rounds that released nothing',
           COVERED),
    Output(run_format.LEDGER_FILE + '.corrupt-*', 'a partial ledger line left by a crash', COVERED),
    Output(run_format.METRICS_FILE, 'one row per round (each column declared in run_format.columns)',
           _metrics),
    Output(run_format.SUPERSEDED_METRICS_FILE, 'rows of rounds a resume re-executed', _metrics),
    Output('checkpoints/*', 'the model, optimizer and clip state after a round (no noise '
           'state)', lambda f: SECRET if f.noise_state_in_checkpoints else COVERED),
    Output(f'{SECRET_DIR}/checkpoints/*', 'checkpoints of a mechanism whose noise spans '
           'rounds: its noise seeds (and an adaptive tree\'s clipped-count nodes)', SECRET),
    Output(f'{SECRET_DIR}/{run_format.NOISE_SNAPSHOTS_FOLDER}/*', 'a correlated-noise '
           'mechanism\'s noise buffers (a tree\'s nodes) after a round, every few rounds (its '
           'checkpoints hold the seed, and a resume replays the rounds since the snapshot)',
           SECRET),
    Output(f'{SECRET_DIR}/sampling_key', 'the permutation samplers\' key (every epoch\'s '
           'order, or cyclic Poisson\'s groups)', SECRET),
    Output(f'{SECRET_DIR}/canary_key', 'the key of the canary directions', SECRET),
    Output(f'{SECRET_DIR}/ledger_key', 'the key of ledger.jsonl\'s chained MACs (a forged, '
           'moved or spliced line is refused when it is given)', SECRET),
    Output(f'{SECRET_DIR}/ledger_seal', 'the count of ledger.jsonl\'s lines and its chain\'s '
           'head, under the ledger key (a ledger cut short is refused when it is given)',
           SECRET),
    Output(f'{SECRET_DIR}/population_digest', 'SHA-256 of the sampled population\'s client '
           'ids (a resume on another population is refused)', SECRET),
    Output(f'{SECRET_DIR}/holdout_key', 'the key choosing the held-out evaluation clients',
           SECRET),
    Output('tensorboard/*', 'TensorBoard events: the metrics columns with wall-clock times',
           DIAGNOSTIC),
    Output('plots/epsilon_vs_round.png', 'epsilon after each round', COVERED),
    Output('plots/projected_epsilon_vs_round.png', 'a noise cohort\'s projected production '
           'epsilon after each round (a projection, not this run\'s guarantee)', COVERED),
    Output('plots/epsilon_estimated_vs_proven.png', 'canary estimates beside the bound',
           COVERED),
    Output(canary_scores.FILE, 'every canary\'s scores at each evaluation round, and which '
           'canaries were inserted: functions of the released models and the canaries\' secret '
           'directions, about no real client', COVERED),
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
    raise KeyError(f'{relpath}: not a declared output of a run (tff_dp.run_format.release)')
  return output.kind(facts)


def classify_column(name: str, facts: RunFacts) -> str:
  """COVERED or DIAGNOSTIC for metrics column `name` (`columns.coverage`); KeyError for a
  column `columns` does not declare (a new metric is declared there before a run may write
  it)."""
  return columns.coverage(name, facts)


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
