"""What a run reports: the console line of each round, and the final report of a finished run
(uncertainty.json, plots, the privacy statement, summary.json)."""

import dataclasses
from typing import Any, Mapping

from tff_dp import checkpoint_aggregation
from tff_dp import mechanisms
from tff_dp.accounting import guarantee
from tff_dp.run_format import columns
from tff_dp.run_format import console
from tff_dp.run_format import release
from tff_dp.training.builders import components
from tff_dp.training.builders import evaluation
from tff_dp.training.report import plots
from tff_dp.training.report import privacy_statement
from tff_dp.training.report import release_folder
from tff_dp.training.run_state import round_hooks
from tff_dp.training.run_state import run_dir as run_dir_lib


def console_line(row: Mapping[str, Any], total_rounds: int) -> str:
  """One line per round: round, clients, loss, accuracy, clip(s), epsilons, eval, time (its
  first and last fields, and how tools read it back: `run_format.console`)."""
  parts = [console.round_field(row['round'], total_rounds)]
  if 'num_clients' in row:
    parts.append(f'clients {row["num_clients"]:>3d}')
  if 'train_loss' in row:
    parts.append(f'loss {row["train_loss"]:.4f}')
  if 'train_accuracy' in row:
    parts.append(f'acc {row["train_accuracy"]:.4f}')
  clips = [row[k] for k in columns.names_with_role(row, columns.CLIP)]
  if len(clips) == 1:
    parts.append(f'clip {clips[0]:.4g}')
  elif clips:
    parts.append(f'clips {min(clips):.3g}..{max(clips):.3g}')
  for name in (columns.names_with_role(row, columns.EPSILON)
               + columns.names_with_role(row, columns.PROJECTED_EPSILON)):
    if row[name] is not None:   # The column's name, epsilon shortened: eps_rdp, projected_eps_pld.
      parts.append(f'{name.replace("epsilon", "eps")} {row[name]:.4g}')
  # Canary estimates, named as estimates beside the proven epsilon: a heuristic may exceed
  # the proof, and must not read as one (docs/PRIVACY.md, "Estimate, bound, proof").
  estimates = [f'{k[len(columns.CANARY_EPSILON) + 1:]} {row[k]:.3g}'
               for k in columns.names_with_role(row, columns.CANARY_EPSILON)
               if row[k] is not None]
  if estimates:
    parts.append(f'canary estimate (not a bound): {", ".join(estimates)};')
  if 'eval_accuracy' in row:
    parts.append(f'eval_acc {row["eval_accuracy"]:.4f}')
  if 'round_seconds' in row:
    parts.append(console.seconds_field(row['round_seconds']))
  return '  '.join(parts)


def write_final_report(config: components.LoopConfig, c: components.LoopComponents,
                       summary: components.RunSummary) -> components.RunSummary:
  """Writes the report of a run that ended normally; returns `summary` with its privacy
  statement (and uncertainty report). Each round hook adds its part (`RoundHook.finish`:
  uncertainty.json, canary estimates, the models a release ships). summary.json, written
  last, marks the run as finished (tools such as reproduce.py skip finished runs)."""
  facts = config.release_facts
  with run_dir_lib.writing('the final report', c.run_dir.path):
    final = round_hooks.FinalReport(run_dir=c.run_dir, final_state=summary.final_state,
                                    delta=config.delta, facts=facts)
    if summary.final_state is not None:
      final.models['last_iterate'] = evaluation.flat_model_weights(
          checkpoint_aggregation.model_weights(c.process, summary.final_state))
    for hook in c.hooks:
      hook.finish(final)
    projection = c.privacy.projection
    plots.write_run_plots(c.run_dir.file('metrics.csv'), c.run_dir.file('plots'),
                          delta=config.delta, clip_group_labels=c.clip_group_labels,
                          projection_delta=projection.delta if projection else None,
                          model_labels=final.model_labels, eval_data=config.eval_description,
                          simulation=projection is not None)
    privacy = dict(_privacy_statement(config, c, summary.rounds_completed), **final.statement)
    summary = dataclasses.replace(summary, privacy=privacy, uncertainty=final.uncertainty)
    c.run_dir.write_json('summary.json', {
        'rounds_completed': summary.rounds_completed, 'total_rounds': config.total_rounds,
        'stopped_by_max_epsilon': summary.stopped_by_max_epsilon,
        'privacy': summary.privacy})
    if facts.private_release and facts.dp:
      release_folder.write(c.run_dir.path, facts, final.models, c.evaluator)
  c.log(privacy_statement.format_statement(summary.privacy))
  return summary


def _privacy_statement(config: components.LoopConfig, c: components.LoopComponents,
                       rounds: int) -> dict[str, Any]:
  epsilons, extra = {}, {}
  event = c.sampler.sampling_event(max(rounds, 1))
  accountant = c.privacy.accountant
  if accountant is not None:
    epsilons = accountant.epsilon(final=True)
    extra['neighboring_relation'] = accountant.neighboring_relation
    extra['headline'] = guarantee.of_records(
        c.privacy.records, config.delta, accountant.methods,
        epsilons=epsilons,
        found=mechanisms.claim(config.dp, event.kind, event.probability_given))
  rows = c.run_dir.metrics.read_rows()
  # What the run directory will hold once the report is written.
  files = release.run_files(c.run_dir.path) + ['summary.json']
  if config.private_release and config.dp != 'none':
    files.append(f'{release.RELEASE_DIR}/')
  return privacy_statement.statement(
      files=files,
      dp=config.dp, rounds_completed=rounds, epsilons=epsilons, delta=config.delta,
      sampling_event=event, facts=config.release_facts,
      released_columns=rows[0].keys() if rows else (), eval_data=config.eval_description,
      side_information=config.side_information,
      projection=(c.privacy.projection.statement()
                  if c.privacy.projection is not None else None), **extra)
