"""The release/ folder of a private release: the publishable set, to ship as it is.

It holds only outputs the classification (`tff_dp.run_format.release`) calls covered:
  models/NAME.keras   the final model (last iterate) and each checkpoint aggregate (EMA,
                      past-k), in Keras' own format
  metrics.csv         the covered columns (epsilon, clips, evaluation when covered)
  ledger.jsonl        the privacy ledger (anyone can recompute epsilon from it)
  summary.json        the privacy statement and how the run ended
  config.json         the settings, without seeds or paths of the operator's machine
  plots/              the covered plots
  uncertainty.json    the last-k widths (no per-example values), when evaluation is covered
Every file gets the same modification time, so the folder carries no per-round timing.
"""

import json
import os
import shutil
import time
from typing import Mapping, Sequence

import numpy as np

from tff_dp import atomic_write
from tff_dp.run_format import release

# Settings a published config.json leaves out: seeds that reproduce secret randomness, and
# paths of the operator's machine.
_UNPUBLISHED_SETTINGS = ('sampling_seed', 'canary_seed', 'root_output_dir', 'data_dir',
                         'embedded_data_dir')
_COPIED = ('metrics.csv', 'ledger.jsonl', 'summary.json', 'uncertainty.json')


def write(run_path: str, facts: release.RunFacts,
          models: Mapping[str, Sequence[np.ndarray]], evaluator) -> str:
  """Writes RUN_DIR/release/ anew; returns its path. Copies only the files the classification
  calls covered for this run and leaves the others out (e.g. uncertainty.json when evaluation
  is on protected users): the classification is the rule, this function only follows it."""
  out = os.path.join(run_path, release.RELEASE_DIR)
  if os.path.exists(out):
    shutil.rmtree(out)   # A resumed run that finishes again releases its final state.
  os.makedirs(os.path.join(out, 'models'))
  copied = [name for name in _COPIED if os.path.exists(os.path.join(run_path, name))]
  copied += [os.path.join('plots', name)
             for name in sorted(os.listdir(os.path.join(run_path, 'plots')))]
  for name in copied:
    if release.classify_file(name, facts) != release.COVERED:
      continue
    os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
    shutil.copyfile(os.path.join(run_path, name), os.path.join(out, name))
  with open(os.path.join(run_path, 'config.json')) as f:
    settings = json.load(f)
  public = {k: v for k, v in settings.items()
            if k not in _UNPUBLISHED_SETTINGS and not k.startswith('_')}
  if str(public.get('side_info', '')).startswith('file:'):
    public['side_info'] = 'file:(path left out)'
  atomic_write.write_text(os.path.join(out, 'config.json'),
                          json.dumps(public, indent=2, sort_keys=True))
  if evaluator is not None:
    for name, weights in models.items():
      evaluator.save_model(weights, os.path.join(out, 'models', f'{name}.keras'))
  _same_times(out, time.time())
  return out


def _same_times(folder: str, when: float) -> None:
  for root, dirs, files in os.walk(folder):
    for name in files + dirs:
      os.utime(os.path.join(root, name), (when, when))
  os.utime(folder, (when, when))
