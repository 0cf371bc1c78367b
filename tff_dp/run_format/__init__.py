"""The run directory's format: what each file is called and holds, what each metrics column
means, and what the DP guarantee covers. Written by `tff_dp.training`, read by the privacy
statement, the console, the plots and the paper tables (`tff_dp.tables`), and by anyone's tools:
nothing here imports TensorFlow.

* `classes`: the three classes of an output (covered, secret, diagnostic) and the facts of a run
  they depend on.
* `release`: every file a run can write, and its class.
* `columns`: every metrics column: meaning, unit, role, class.
* `metrics_csv`: metrics.csv, written and read.
* `console`: the console's line per round, its first and last fields and how tools read it.
"""

import os

from tff_dp import ledger

# The files of a run directory (their classes: `release.OUTPUTS`).
CONFIG_FILE = 'config.json'
CONFIG_HISTORY_FILE = 'config_history.jsonl'
METRICS_FILE = 'metrics.csv'
LEDGER_FILE = 'ledger.jsonl'
SUMMARY_FILE = 'summary.json'
SUPERSEDED_METRICS_FILE = 'metrics.superseded.csv'
UNRELEASED_LEDGER_FILE = 'ledger.unreleased.jsonl'
# Where checkpoints live (secret/ for mechanisms whose state holds noise), each a folder
# `CHECKPOINT_PREFIX` + round.
CHECKPOINT_FOLDERS = ('checkpoints', 'secret/checkpoints')
CHECKPOINT_PREFIX = 'round_'


# The secrets a run keeps in its secret/ folder (their classes: `release.OUTPUTS`).
SECRET_FOLDER = 'secret'
SAMPLING_KEY_FILE = 'sampling_key'         # The permutation samplers' key.
POPULATION_DIGEST_FILE = 'population_digest'   # The sampled population's digest.
LEDGER_KEY_FILE = 'ledger_key'             # The key of the ledger's chained MACs.
LEDGER_SEAL_FILE = ledger.SEAL_FILE         # The ledger's count and chain head, under the key.
NOISE_SNAPSHOTS_FOLDER = 'noise_snapshots'  # A correlated-noise run's buffers, now and then.


def secret_path(run_path: str, name: str) -> str:
  """RUN_PATH/secret/`name`; for a run directory written before secret/ existed, its old
  `name`.secret beside the checkpoints when that exists."""
  legacy = os.path.join(run_path, f'{name}.secret')
  return legacy if os.path.exists(legacy) else os.path.join(run_path, SECRET_FOLDER, name)


def checkpointed_rounds(run_path: str) -> int:
  """The last round a run directory holds a checkpoint of (0: none), from folder names."""
  rounds = [0]
  for folder in CHECKPOINT_FOLDERS:
    try:
      names = os.listdir(os.path.join(run_path, folder))
    except OSError:
      continue
    rounds += [int(n[len(CHECKPOINT_PREFIX):]) for n in names
               if n.startswith(CHECKPOINT_PREFIX) and n[len(CHECKPOINT_PREFIX):].isdigit()]
  return max(rounds)
