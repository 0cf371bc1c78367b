"""Paper tables from finished runs: a Markdown table beside the papers' numbers, and plots.

`python -m tff_dp.tables --runs DIR [DIR ...] --output_dir OUT`; see `build_tables`. Runs of
one arm that differ only in their seed (config.json equal but for `seed`) are shown one row per
seed followed by a "mean ± sd" row, and one plot line per seed.
"""

import os
from typing import Optional, Sequence

from tff_dp import atomic_write
from tff_dp.tables import markdown
from tff_dp.tables import plots
from tff_dp.tables.run_results import read_run
from tff_dp.tables.run_results import RunResult
from tff_dp.tables.run_results import seed_group_key


def build_tables(run_dirs: Sequence[str], output_dir: str, *, delta: Optional[float] = None,
                 method: str = 'rdp', preamble: str = '') -> dict:
  """Reads `run_dirs`, writes OUTPUT_DIR/results.md and per-table PNGs; returns their paths."""
  results = [read_run(d, delta=delta, method=method) for d in run_dirs]
  os.makedirs(output_dir, exist_ok=True)
  table_path = os.path.join(output_dir, 'results.md')
  text = markdown.render(results, preamble=preamble)
  pngs = []
  for title, group in markdown.group_by_table(results).items():
    pngs += plots.write_plots(group, output_dir, plots.slug(title), accountant=method)
  text += '\n## Plots\n\n' + '\n'.join(
      f'![{os.path.basename(p)}]({os.path.basename(p)})' for p in pngs) + '\n'
  atomic_write.write_text(table_path, text)
  return {'table': table_path, 'plots': pngs, 'results': results}
