"""What a release covers (issue 24): every file and column a run writes is classified, secrets
live apart, evaluation is covered only on clients the accountant does not protect (or on
declared-public data), and a private release is a folder to publish as it is.

Oracles: the run directories themselves (walked, read back, loaded with Keras), literal lists
of what may be published, and set arithmetic on client ids read from TFF's loaders.
"""

import json
import os
import stat

import numpy as np
import pytest
import tensorflow as tf

from tff_dp import measurements
from tff_dp import mechanisms
from tff_dp.aggregators import non_finite
from tff_dp.training import config as config_lib
from tff_dp.training import experiment
from tff_dp.run_format import release
from run_helpers import metrics_rows

POPULATION = 20   # conftest's tag_task.


@pytest.fixture(scope='module')
def task(tag_task):
  return tag_task   # conftest: 20 generated training clients.


def _run(task, root, name, **overrides):
  settings = dict(root_output_dir=str(root), experiment_name=name, task='stackoverflow_tag',
                  total_rounds=3, clients_per_round=5, dp='fixed', clip=1.0,
                  noise_multiplier=0.8, max_eval_examples=40, accounting=('rdp',), seed=3,
                  delta=1e-3, client_batch_size=8, rounds_per_eval=1)
  settings.update(overrides)
  cfg = config_lib.ExperimentConfig.from_settings(settings)
  lines = []
  summary = experiment.run(cfg, task, log=lines.append)
  _run.last_summary = summary
  with open(os.path.join(summary.run_dir, 'summary.json')) as f:
    return summary.run_dir, json.load(f)['privacy'], lines


def _facts(run_dir):
  """The run's facts, re-derived from what its directory records (not from the run)."""
  with open(os.path.join(run_dir, 'config.json')) as f:
    cfg = json.load(f)
  with open(os.path.join(run_dir, 'summary.json')) as f:
    statement = json.load(f)['privacy']
  evaluation = statement['evaluation']
  return release.RunFacts(
      dp=cfg['dp'] != 'none', noise_state_in_checkpoints=cfg['dp'] in ('ftrl', 'ftrl_adaptive'),
      eval_covered='training population' not in evaluation or 'not in' in evaluation,
      seeded=cfg['sampling_seed'] is not None, private_release=cfg['private_release'],
      measurements=_declared(statement.get('aggregator_measurements', {})))


def _declared(stated: dict, depth: int = 1) -> tuple:
  """The statement's {'aggregator/<key path>': 'covered: ...' or '...'} as declarations."""
  by_key = {}
  for column, text in stated.items():
    by_key.setdefault(column.split('/')[depth], {})[column] = text
  out = []
  for key, entries in by_key.items():
    if len(entries) == 1 and next(iter(entries)).count('/') == depth:
      text = next(iter(entries.values()))
      out.append(measurements.Measurement(key, text, covered=text.startswith('covered')))
    else:
      out.append(measurements.Measurement(key, '', inner=_declared(entries, depth + 1)))
  return tuple(out)


def _check_every_output_is_classified(run_dir):
  facts = _facts(run_dir)
  kinds = {path: release.classify_file(path, facts) for path in release.run_files(run_dir)}
  for column in metrics_rows(run_dir)[0]:
    release.classify_column(column, facts)   # KeyError for an unclassified column.
  return kinds


def test_the_test_split_shares_the_training_users_as_in_tff(task):
  # TFF's StackOverflow test split holds later posts of training users; the generated cache
  # models that, and its heldout split holds users of their own.
  train, test = set(task.train_data.client_ids), set(task.test_data.client_ids)
  assert test and test <= train


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_default_run_every_output_classified_eval_on_protected_users_is_diagnostic(
    task, tmp_path):
  run_dir, privacy, _ = _run(task, tmp_path, 'default', ema_beta=0.5, uncertainty_last_k=2)
  kinds = _check_every_output_is_classified(run_dir)
  assert kinds['uncertainty.json'] == release.DIAGNOSTIC   # Per-example scores and labels.
  assert kinds['metrics.csv'] == release.DIAGNOSTIC
  assert kinds['ledger.jsonl'] == release.COVERED
  assert any(k.startswith('tensorboard/') and v == release.DIAGNOSTIC for k, v in kinds.items())
  diagnostics = privacy['non_private_diagnostics']
  assert {'eval_accuracy', 'eval_ema_accuracy', 'num_clients'} <= set(diagnostics)
  assert 'protected users' in privacy['evaluation']
  assert not any(c.startswith('eval_') for c in privacy['covers'])
  with open(os.path.join(run_dir, 'uncertainty.json')) as f:
    assert json.load(f)['statistics']['prediction_scores']['per_example'] is not None


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_private_release_folder_is_publishable_as_it_is(task, tmp_path):
  run_dir, privacy, lines = _run(task, tmp_path, 'public', private_release=True,
                                 eval_data='holdout', eval_holdout_clients=4, ema_beta=0.5,
                                 uncertainty_last_k=2, sampling_seed=7)
  kinds = _check_every_output_is_classified(run_dir)
  published = {p for p in kinds if p.startswith('release/')}
  assert published and all(kinds[p] == release.COVERED for p in published)
  assert {'release/models/last_iterate.keras', 'release/models/ema.keras',
          'release/metrics.csv', 'release/ledger.jsonl', 'release/summary.json',
          'release/config.json', 'release/plots/epsilon_vs_round.png',
          'release/uncertainty.json'} <= published
  assert not os.path.exists(os.path.join(run_dir, 'tensorboard'))
  # One modification time for the whole folder: no per-round timing.
  assert len({os.stat(os.path.join(run_dir, p)).st_mtime for p in published}) == 1
  # The seed is the operator's: config.json is secret, the published one has no seed.
  assert kinds['config.json'] == release.SECRET
  with open(os.path.join(run_dir, 'release', 'config.json')) as f:
    published_config = json.load(f)
  assert 'sampling_seed' not in published_config and published_config['dp'] == 'fixed'
  for path in published:
    with open(os.path.join(run_dir, path), 'rb') as f:
      assert b'sampling_seed' not in f.read() or path == 'release/summary.json'
  # Held-out evaluation clients are not in the protected population.
  assert published_config['population_size'] == POPULATION - 4
  assert 'eval_accuracy' in metrics_rows(os.path.join(run_dir, 'release'))[0]
  with open(os.path.join(run_dir, 'release', 'uncertainty.json')) as f:
    scores = json.load(f)['statistics']['prediction_scores']
  assert scores['per_example'] is None and scores['predicted_label_score']['per_example'] is None
  # The model loads with Keras alone and is the run's final model.
  model = tf.keras.models.load_model(os.path.join(run_dir, 'release', 'models',
                                                  'last_iterate.keras'))
  final = _run.last_summary.final_state.global_model_weights.trainable
  assert len(model.trainable_weights) == len(final)
  for released, trained in zip(model.trainable_weights, final):
    np.testing.assert_array_equal(released.numpy(), np.asarray(trained))
  assert 'release/*: the publishable set of a private release' in privacy['covers']
  assert not any('client' in l and l.startswith('round ') for l in lines)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_private_release_drops_evaluation_on_protected_users(task, tmp_path):
  run_dir, privacy, _ = _run(task, tmp_path, 'shared', private_release=True,
                             uncertainty_last_k=2)
  kinds = _check_every_output_is_classified(run_dir)
  assert not any(c.startswith('eval_') for c in metrics_rows(run_dir)[0])
  assert 'uncertainty.json' not in kinds
  assert 'release/plots/accuracy_vs_epsilon.png' not in kinds
  assert 'release/models/last_iterate.keras' in kinds


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_public_test_data_is_covered_by_declaration(task, tmp_path):
  run_dir, privacy, _ = _run(task, tmp_path, 'declared', eval_data='public_test',
                             private_release=True)
  assert 'eval_accuracy' in metrics_rows(run_dir)[0]
  assert 'declared public' in privacy['evaluation']


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_tree_checkpoints_hold_the_noise_and_are_secret(task, tmp_path):
  run_dir, privacy, _ = _run(task, tmp_path, 'tree', dp='ftrl', client_sampling='shuffled',
                             rounds_per_checkpoint=1, private_release=True,
                             eval_data='public_test')
  kinds = _check_every_output_is_classified(run_dir)
  checkpoints = [p for p in kinds if '/round_' in p]
  assert checkpoints and all(p.startswith('secret/checkpoints/round_') for p in checkpoints)
  assert all(kinds[p] == release.SECRET for p in checkpoints)
  assert kinds['secret/sampling_key'] == release.SECRET
  assert stat.S_IMODE(os.stat(os.path.join(run_dir, 'secret')).st_mode) == 0o700
  assert stat.S_IMODE(os.stat(os.path.join(run_dir, 'secret', 'sampling_key')).st_mode) == 0o600
  assert not any('checkpoints' in c for c in privacy['covers'])
  assert any(s.startswith('secret/checkpoints/*') for s in privacy['secrets'])
  assert not any(p.startswith('release/') and 'round_' in p for p in kinds)
  # The tree's noise state really is in the secret checkpoint: resume reads it from there.
  summary = experiment.run(config_lib.ExperimentConfig.from_settings(dict(
      root_output_dir=str(tmp_path), experiment_name='tree', task='stackoverflow_tag',
      total_rounds=5, clients_per_round=5, dp='ftrl', clip=1.0, noise_multiplier=0.8,
      max_eval_examples=40, accounting=('rdp',), seed=3, delta=1e-3, client_batch_size=8,
      client_sampling='shuffled', rounds_per_checkpoint=1, private_release=True,
      eval_data='public_test', resume=True)), task, log=lambda line: None)
  assert summary.rounds_completed == 5


def test_unknown_outputs_are_refused_by_the_classification():
  facts = release.RunFacts(measurements=measurements.declared(non_finite.NonFiniteZeroingFactory(
      mechanisms.build_aggregator('fixed', noise_multiplier=1.0, clients_per_round=5.0,
                                  clip=1.0))))
  with pytest.raises(KeyError):
    release.classify_file('model_weights.npz', facts)
  with pytest.raises(KeyError):
    release.classify_column('client_ids_seen', facts)
  assert release.classify_column('aggregator/zero_updates', facts) == release.DIAGNOSTIC
  assert release.classify_column('aggregator/privacy_queries/update/l2_norm_clip',
                                 facts) == release.COVERED
  assert release.classify_file('checkpoints/round_3/saved_model.pb', facts) == release.COVERED
  tree = release.RunFacts(noise_state_in_checkpoints=True)
  assert release.classify_file('checkpoints/round_3/saved_model.pb', tree) == release.SECRET
  assert release.classify_file('secret/checkpoints/round_3/x', facts) == release.SECRET
  no_dp = release.RunFacts(dp=False)
  assert release.classify_file('ledger.jsonl', no_dp) == release.DIAGNOSTIC
