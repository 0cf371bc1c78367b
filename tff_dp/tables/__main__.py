"""CLI: build the Markdown results table and plots from finished run directories.

  python -m tff_dp.tables --runs runs/tables/andrew2021_emnist-smoke/* --output_dir OUT

Writes OUT/results.md (ours beside the paper's numbers, grouped by the paper table each run
names) and OUT/<table>_{accuracy_vs_round,clip_vs_round,epsilon_vs_round,accuracy_vs_epsilon}.png.
Several seeds of one arm (runs whose config.json differs only in `seed`): one row and one plot
line per seed, and a "mean ± sd" row under them.
Bad input: one line on stderr, exit code 2.
"""

import sys

from absl import flags

from tff_dp import cli_flags
from tff_dp import errors

FLAGS = flags.FlagValues()
flags.DEFINE_list('runs', None, 'Run directories to tabulate (comma-separated, or several '
                  'paths after --runs).', flag_values=FLAGS)
flags.DEFINE_string('output_dir', 'tables_out', 'Where results.md and the PNGs are written.',
                    flag_values=FLAGS)
flags.DEFINE_float('delta', None, 'Delta for every epsilon (default: the paper\'s delta named '
                   'by each run, else the delta the run used).', flag_values=FLAGS)
flags.DEFINE_enum('method', 'rdp', ['rdp', 'pld'], 'Accountant replaying each ledger.',
                  flag_values=FLAGS)


def _expand_runs(argv: list[str]) -> list[str]:
  """Lets `--runs a b c` (shell globs) work: paths after --runs up to the next flag."""
  out, i = [], 0
  while i < len(argv):
    if argv[i] == '--runs':
      j = i + 1
      paths = []
      while j < len(argv) and not argv[j].startswith('--'):
        paths.append(argv[j])
        j += 1
      out.append('--runs=' + ','.join(paths))
      i = j
    else:
      out.append(argv[i])
      i += 1
  return out


def main(argv) -> int:
  try:
    if cli_flags.parse(FLAGS, _expand_runs(list(argv)), __doc__) == 0:
      return 0
    # After parsing: --help and flag errors answer without importing matplotlib and TF.
    from tff_dp import tables  # pylint: disable=g-import-not-at-top
    if not FLAGS.runs:
      raise errors.UserInputError('--runs needs at least one run directory')
    out = tables.build_tables([cli_flags.path(r) for r in FLAGS.runs],
                              cli_flags.path(FLAGS.output_dir), delta=FLAGS.delta,
                              method=FLAGS.method)
  except errors.UserInputError as e:
    return cli_flags.report(e, FLAGS)
  print(f'wrote {out["table"]} and {len(out["plots"])} plots')
  return 0


if __name__ == '__main__':
  sys.exit(cli_flags.run_program(
      main, sys.argv, 'the tables and plots written so far are whole; rerun to write the rest'))
