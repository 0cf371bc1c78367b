"""CLI: the canary audit of a finished (or stopped) run, recomputed from its stored scores.

  python -m tff_dp.canaries --run_dir runs/X [--confidence 0.95] [--delta D]

Reads RUN_DIR/canary_scores.csv and prints, for every evaluation round, the lower bounds on
epsilon (one run, when the canaries were each inserted by coin; Clopper-Pearson) and the
attack's diagnostics (TPR at FPR, AUROC) as CSV: with the run's delta and 95% confidence, the
figures of its metrics.csv, without training again.
Bad input: one line on stderr, exit code 2.
"""

import csv
import dataclasses
import json
import math
import os
import sys

from absl import flags

from tff_dp import cli_flags
from tff_dp import errors

FLAGS = flags.FlagValues()
flags.DEFINE_string('run_dir', None, 'The run directory (it holds canary_scores.csv).',
                    flag_values=FLAGS)
flags.DEFINE_float('confidence', 0.95, 'Confidence of the lower bounds, in (0, 1).',
                   flag_values=FLAGS)
flags.DEFINE_float('delta', None, 'Delta of the bounds (default: the delta the run used).',
                   flag_values=FLAGS)


def main(argv) -> int:
  try:
    if cli_flags.parse(FLAGS, list(argv), __doc__) == 0:
      return 0
    rows = _audit(cli_flags.path(FLAGS.run_dir), FLAGS.confidence, FLAGS.delta)
  except errors.UserInputError as e:
    return cli_flags.report(e, FLAGS)
  names = list(dict.fromkeys(k for row in rows for k in row))
  writer = csv.DictWriter(sys.stdout, fieldnames=names)
  writer.writeheader()
  writer.writerows(rows)
  return 0


def _audit(run_dir, confidence: float, delta) -> list[dict]:
  # pylint: disable=g-import-not-at-top  (after parsing: --help answers at once)
  from tff_dp import run_format
  from tff_dp.canaries import scores as scores_lib
  from tff_dp.run_format import canary_audit
  from tff_dp.training import config_sections
  if not run_dir:
    raise errors.UserInputError('--run_dir is required')
  if not 0 < confidence < 1:
    raise errors.UserInputError(f'--confidence={confidence}: must be in (0, 1)')
  if delta is not None and not (0 < delta < 1 and math.isfinite(delta)):
    raise errors.UserInputError(f'--delta={delta}: must be in (0, 1)')
  path = os.path.join(run_dir, scores_lib.FILE)
  if not os.path.isfile(path):
    raise errors.UserInputError(f'--run_dir={run_dir}: no {scores_lib.FILE} (a run with '
                                'canaries writes it on its evaluation rounds)')
  try:
    with open(os.path.join(run_dir, run_format.CONFIG_FILE)) as f:
      config = json.load(f)
    section = config_sections.CanaryConfig(**{
        f.name: config[f.name] for f in dataclasses.fields(config_sections.CanaryConfig)
        if f.name in config})
    by_round = scores_lib.read(path, canaries=section.num_canaries + section.unseen)
  except (OSError, ValueError, KeyError) as e:
    raise errors.UserInputError(f'--run_dir={run_dir}: cannot read the run ({e})') from None
  delta = config['delta_used'] if delta is None else delta
  coin = config.get('canary_inclusion') == 'coin'
  return [dict(round=r, **canary_audit.columns_of(s, delta, coin=coin, round_num=r,
                                                  confidence=confidence))
          for r, s in by_round.items()]


if __name__ == '__main__':
  sys.exit(cli_flags.run_program(main, sys.argv, 'nothing was written'))
