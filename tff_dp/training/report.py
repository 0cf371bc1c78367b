"""What a run reports: the console line of each round, and the final report of a finished run
(uncertainty.json, plots, the privacy statement, summary.json)."""

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from tff_dp import checkpoint_aggregation
from tff_dp import choices
from tff_dp import ledger as ledger_lib
from tff_dp.accounting import guarantee
from tff_dp.training import components
from tff_dp.training import evaluation
from tff_dp.training import metrics_file
from tff_dp.training import plots
from tff_dp.training import privacy_statement
from tff_dp.training import release
from tff_dp.training import release_folder
from tff_dp.training import run_dir as run_dir_lib


def console_line(row: Mapping[str, Any], total_rounds: int) -> str:
  """One line per round: round, clients, loss, accuracy, clip(s), epsilons, eval, time."""
  parts = [f'round {row["round"]:>4d}/{total_rounds}']
  if 'num_clients' in row:
    parts.append(f'clients {row["num_clients"]:>3d}')
  if 'train_loss' in row:
    parts.append(f'loss {row["train_loss"]:.4f}')
  if 'train_accuracy' in row:
    parts.append(f'acc {row["train_accuracy"]:.4f}')
  clips = [v for k, v in row.items() if metrics_file.is_clip_column(k)]
  if len(clips) == 1:
    parts.append(f'clip {clips[0]:.4g}')
  elif clips:
    parts.append(f'clips {min(clips):.3g}..{max(clips):.3g}')
  for method in choices.ACCOUNTANTS:
    if row.get(f'epsilon_{method}') is not None:
      parts.append(f'eps_{method} {row[f"epsilon_{method}"]:.4g}')
  estimates = [f'{row[k]:.3g}' for k in metrics_file.CANARY_EPSILON_COLUMNS if k in row]
  if estimates:
    parts.append(f'eps_canary {"/".join(estimates)}')
  if 'eval_accuracy' in row:
    parts.append(f'eval_acc {row["eval_accuracy"]:.4f}')
  if 'round_seconds' in row:
    parts.append(f'{row["round_seconds"]:.2f}s')
  return '  '.join(parts)


def write_final_report(config: components.LoopConfig, c: components.LoopComponents,
                       summary: components.RunSummary, recent) -> components.RunSummary:
  """Writes the report of a run that ended normally; returns `summary` with its privacy
  statement (and uncertainty report). summary.json, written last, marks the run as finished
  (tools such as reproduce.py skip finished runs). `recent`: the last-k model weights."""
  facts = config.release_facts
  with run_dir_lib.writing('the final report', c.run_dir.path):
    # Per-example scores and labels are never covered: a private release keeps the widths,
    # and only when evaluation is covered.
    if (config.uncertainty_last_k and c.evaluator is not None and len(recent) >= 2
        and (facts.eval_covered or not facts.private_release)):
      summary = dataclasses.replace(summary, uncertainty=_write_uncertainty(
          c, list(recent), per_example=not facts.private_release))
    plots.write_run_plots(c.run_dir.file('metrics.csv'), c.run_dir.file('plots'),
                          delta=config.delta, clip_group_labels=c.clip_group_labels)
    privacy = _privacy_statement(config, c, summary.rounds_completed)
    if c.canaries is not None and summary.final_state is not None and config.dp != 'none':
      privacy['empirical_estimate'] = _canary_estimates(config, c, summary.final_state)
    summary = dataclasses.replace(summary, privacy=privacy)
    c.run_dir.write_json('summary.json', {
        'rounds_completed': summary.rounds_completed, 'total_rounds': config.total_rounds,
        'stopped_by_max_epsilon': summary.stopped_by_max_epsilon,
        'privacy': summary.privacy})
    if facts.private_release and config.dp != 'none':
      release_folder.write(c.run_dir.path, facts, _final_models(c, summary.final_state),
                           c.evaluator)
  c.log(privacy_statement.format_statement(summary.privacy))
  return summary


def _final_models(c: components.LoopComponents, final_state) -> dict[str, list]:
  """{name: flat weights} of the models a release ships: the last iterate and each checkpoint
  aggregate (EMA, past-k) that has a value."""
  models = {}
  if final_state is not None:
    models['last_iterate'] = evaluation.flat_model_weights(
        checkpoint_aggregation.model_weights(c.process, final_state))
  for name, agg in c.aggregates.items():
    if agg.value() is not None:
      models[name] = agg.value()
  return models


def _privacy_statement(config: components.LoopConfig, c: components.LoopComponents,
                       rounds: int) -> dict[str, Any]:
  epsilons, extra = {}, {}
  event = c.sampler.sampling_event(max(rounds, 1))
  if c.accountant is not None:
    epsilons = {m: c.accountant.epsilon_rdp() if m == 'rdp' else c.accountant.epsilon_pld()
                for m in c.accountant.methods}
    extra['neighboring_relation'] = c.accountant.neighboring_relation
    records = ledger_lib.read_ledger(c.ledger.path) if c.ledger is not None else []
    if event.kind == 'fixed_size':
      extra['fixed_size_proven'] = guarantee.fixed_size_proven(records, config.delta)
    if event.seeded and event.kind != 'shuffled':
      relation = 'replace_one' if event.kind == 'fixed_size' else extra['neighboring_relation']
      extra['without_amplification'] = guarantee.without_amplification(
          records, config.delta, c.accountant.methods, relation)
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
      side_information=config.side_information, **extra)


def _canary_estimates(config: components.LoopConfig, c: components.LoopComponents,
                      final_state) -> dict[str, Any]:
  """The statement's empirical estimate of the final model (and of all iterates)."""
  tracker = c.canaries.tracker
  trainable = [np.asarray(w) for w in
               checkpoint_aggregation.model_weights(c.process, final_state).trainable]
  estimates = {'final_model': (tracker.final_model_estimate(trainable, config.delta),
                               tracker.final_model_interval(trainable, config.delta)),
               'all_iterates': (tracker.all_iterates_estimate(config.delta),
                                tracker.all_iterates_interval(config.delta))}
  return privacy_statement.empirical_estimate(
      tracker.directions.num_inserted, tracker.directions.num_unseen,
      {name: e for name, e in estimates.items() if e[0] is not None})


def _write_uncertainty(c: components.LoopComponents, recent,
                       per_example: bool) -> dict[str, Any]:
  accuracies = np.array([c.evaluator.evaluate(w).get('accuracy', math.nan) for w in recent])
  scores = np.stack([c.evaluator.predict_scores(w) for w in recent])
  limit = {} if per_example else {'max_per_example_values': 0}
  return checkpoint_aggregation.write_uncertainty_report(
      c.run_dir.file('uncertainty.json'), accuracy=accuracies, prediction_scores=scores,
      **limit)
