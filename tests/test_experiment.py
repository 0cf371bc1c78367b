"""The training loop's privacy behaviour: --max_epsilon, and post-processing leaves the ledger alone."""

import json
import os

import dp_accounting
import numpy as np
import pytest

import tasks
from tff_dp import ledger as ledger_lib
from tff_dp import privacy
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib
from tff_dp.training import experiment
from tff_dp.training.builders import fed_avg
from run_helpers import metrics_rows


@pytest.fixture(scope='module')
def data_dir(tag_data_dir):
  return tag_data_dir   # conftest: 20 generated training clients.


def _task(data_dir):
  return tasks.build_task('stackoverflow_tag', data_dir, client_batch_size=8, shuffle_seed=0,
                          word_vocab_size=200, tag_vocab_size=30)


def _run(data_dir, root, name, **overrides):
  cfg = dict(root_output_dir=str(root), experiment_name=name, task='stackoverflow_tag',
             total_rounds=4, clients_per_round=5, dp='fixed', clip=1.0, noise_multiplier=0.8,
             max_eval_examples=50, accounting=('rdp',), seed=3)
  cfg.update(overrides)
  summary = experiment.run(config_lib.ExperimentConfig.from_settings(cfg), _task(data_dir),
                           log=lambda s: None)
  rows = metrics_rows(summary.run_dir)
  records = ledger_lib.read_ledger(os.path.join(summary.run_dir, 'ledger.jsonl'))
  return summary, rows, records


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_max_epsilon_stops_before_the_round_that_would_exceed_it(data_dir, tmp_path):
  _, full_rows, full_records = _run(data_dir, tmp_path, 'full', total_rounds=6)
  eps = [float(r['epsilon_rdp']) for r in full_rows]
  limit = (eps[2] + eps[3]) / 2          # Round 3 fits under the limit, round 4 would not.
  summary, rows, records = _run(data_dir, tmp_path, 'capped', total_rounds=6, max_epsilon=limit)
  assert summary.stopped_by_max_epsilon
  assert summary.rounds_completed == 3
  assert [int(r['round']) for r in rows] == [1, 2, 3]
  assert len(records) == 3 and max(float(r['epsilon_rdp']) for r in rows) <= limit
  # Independent check, from the settings alone (fixed clip, z = 0.8, q = 5 / 20), with
  # dp_accounting: each round's epsilon is the run's, and a fourth round crosses the limit.
  with open(tmp_path / 'full' / 'config.json') as f:
    delta = json.load(f)['delta_used']
  direct = []
  for rounds in range(1, 7):
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.25, dp_accounting.GaussianDpEvent(0.8)),
                rounds)
    direct.append(acc.get_epsilon(delta))
  assert eps == pytest.approx(direct, rel=1e-6)
  assert direct[3] > limit >= direct[2]


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_checkpoint_aggregation_and_preconditioning_leave_ledger_unchanged(data_dir, tmp_path):
  _, base_rows, base_records = _run(data_dir, tmp_path, 'base')
  _, agg_rows, agg_records = _run(
      data_dir, tmp_path, 'aggregates', ema_beta=0.9, past_k=2, train_on_aggregate='ema',
      aggregate_start_round=2, uncertainty_last_k=3)
  _, pre_rows, pre_records = _run(data_dir, tmp_path, 'adadps', precondition='client',
                                  side_info='word_freq')
  assert base_records == agg_records == pre_records     # Same sampling, same queries.
  for rows in (agg_rows, pre_rows):
    assert [r['epsilon_rdp'] for r in rows] == [r['epsilon_rdp'] for r in base_rows]
  # ...while the post-processing really happened.
  assert 'eval_ema_accuracy' in agg_rows[-1] and agg_rows[-1]['trained_from_aggregate'] == '1'
  assert os.path.exists(tmp_path / 'aggregates' / 'uncertainty.json')
  assert [r['train_loss'] for r in pre_rows] != [r['train_loss'] for r in base_rows]


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_loop_implementation_reaches_tff_and_trains_the_same_model(data_dir, tmp_path,
                                                                   monkeypatch):
  """Both client loops (AdaDPS client path included) give one model; the choice reaches TFF."""
  built = []
  build = fed_avg.build_fed_avg

  def spy(*args, **kwargs):
    built.append(build(*args, **kwargs))
    return built[-1]
  monkeypatch.setattr(fed_avg, 'build_fed_avg', spy)
  weights = {}
  for loop in ('dataset_reduce', 'dataset_iterator'):
    summary, _, _ = _run(data_dir, tmp_path, loop, loop_implementation=loop, total_rounds=1,
                         noise_multiplier=0.0, sampling_seed=7, precondition='client',
                         side_info='word_freq')
    weights[loop] = summary.final_state.global_model_weights.trainable
  # The client work's TF graph holds a DatasetReduce op only when asked for.
  graphs = [p.next.to_building_block().proto.SerializeToString() for p in built]
  assert [b'ReduceDataset' in g for g in graphs] == [True, False]
  for reduced, iterated in zip(weights['dataset_reduce'], weights['dataset_iterator']):
    np.testing.assert_allclose(reduced, iterated, rtol=1e-5, atol=1e-6)
  initial = built[1].get_model_weights(built[1].initialize()).trainable
  assert not all(np.array_equal(a, b) for a, b in zip(initial, weights['dataset_iterator']))


def test_loop_implementation_is_validated_and_may_change_on_resume(tmp_path):
  cfg = config_lib.ExperimentConfig.from_settings(root_output_dir=str(tmp_path),
                                                  experiment_name='exp', dp='none')
  assert cfg.runtime.loop_implementation == 'dataset_iterator'
  recorded = json.loads(json.dumps(cfg.settings()))   # As config.json holds it.
  changed = cfg.replace(loop_implementation='dataset_reduce')
  assert experiment.resume_changes(recorded, changed) == {
      'loop_implementation': ('dataset_iterator', 'dataset_reduce')}
  with pytest.raises(UserInputError, match='`loop_implementation`'):
    cfg.replace(loop_implementation='DATASET_REDUCE')


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_worker_restarts_between_rounds_leave_the_model_unchanged(data_dir, tmp_path):
  """--worker_restart_rounds=2: a fresh worker_binary from round 3 on, the same trained model."""
  from tff_dp.execution import runtime  # pylint: disable=g-import-not-at-top
  runtime.configure_execution_context()   # The context the CLI runs in (restarts need it).
  weights, pids = {}, {}
  for every in (0, 2):
    seen = []
    cfg = config_lib.ExperimentConfig.from_settings(
        root_output_dir=str(tmp_path), experiment_name=f'restart_{every}', total_rounds=4,
        clients_per_round=5, dp='fixed', clip=1.0, noise_multiplier=0.0, sampling_seed=7,
        max_eval_examples=50, accounting=('rdp',), seed=3, worker_restart_rounds=every)
    summary = experiment.run(cfg, _task(data_dir),
                             log=lambda s, seen=seen: seen.append(tuple(runtime.worker_pids())))
    weights[every] = summary.final_state.global_model_weights.trainable
    pids[every] = [p for p in seen if p]
  assert len(set(pids[0])) == 1                  # One worker for the whole run ...
  assert len(set(pids[2])) == 2, pids[2]         # ... or a fresh one after round 2.
  for kept, restarted in zip(weights[0], weights[2]):
    np.testing.assert_allclose(kept, restarted, rtol=1e-6, atol=1e-7)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_max_epsilon_stops_a_seeded_run_before_its_headline_passes_it(data_dir, tmp_path):
  """A seeded run's headline is the epsilon against the seed holder (no amplification: the
  rounds compose as one Gaussian of multiplier z / sqrt(rounds)). The cap must stop the run
  before that headline passes it, not before the amplified per-round columns do (which stay
  below the cap for all 4 rounds here)."""
  def gaussian_epsilon(z, delta):   # dp_accounting, built here.
    return dp_accounting.rdp.RdpAccountant().compose(
        dp_accounting.GaussianDpEvent(z)).get_epsilon(delta)

  full, full_rows, _ = _run(data_dir, tmp_path, 'full', sampling_seed=7, noise_multiplier=1.0)
  with open(tmp_path / 'full' / 'config.json') as f:
    delta = json.load(f)['delta_used']
  headline = [gaussian_epsilon(1.0 / np.sqrt(r), delta) for r in range(1, 5)]
  assert full.privacy['epsilon']['rdp'] == pytest.approx(headline[3], rel=1e-6)
  limit = (headline[1] + headline[2]) / 2
  assert max(float(r['epsilon_rdp']) for r in full_rows) < limit   # The columns never reach it.
  summary, rows, records = _run(data_dir, tmp_path, 'capped', sampling_seed=7,
                                noise_multiplier=1.0, max_epsilon=limit)
  assert summary.stopped_by_max_epsilon and summary.rounds_completed == 2 and len(records) == 2
  assert summary.privacy['epsilon']['rdp'] == pytest.approx(headline[1], rel=1e-6)
  assert headline[1] <= limit
  # q was derived from the population (5 / 20): the claim is zero-out, with that epsilon.
  assert summary.privacy['neighboring_relation'] == 'replace_special'
  # The library API states the same headline for the same records (its sampler over a
  # population of the same size and seed draws the same sampling events).
  full_records = ledger_lib.read_ledger(os.path.join(full.run_dir, 'ledger.jsonl'))
  private = privacy.PrivateAggregation.build(
      'fixed', [f'c{i}' for i in range(full_records[0].sampling.population_size)],
      clients_per_round=5, clip=1.0, noise_multiplier=1.0, delta=delta, sampling_seed=7)
  for record in full_records:
    q = record.queries[0]
    private.record(record.round_num, {'privacy_queries': {q.name: {
        'l2_norm_clip': q.l2_norm_clip, 'noise_stddev': q.noise_stddev}}})
  assert private.records == full_records
  assert private.epsilon()['rdp'] == pytest.approx(full.privacy['epsilon']['rdp'], rel=1e-12)
  assert private.statement()['neighboring_relation'] == 'replace_special'


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_given_sampling_rate_states_add_remove(data_dir, tmp_path):
  """`sampling_probability` fixes q before the data is seen: recorded in config.json and every
  ledger record, used whatever N is, and the claim is add/remove-one (dp_accounting here)."""
  summary, _, records = _run(data_dir, tmp_path, 'given', sampling_probability=0.3,
                             total_rounds=2)
  assert all(r.sampling.probability == 0.3 and r.sampling.probability_given for r in records)
  with open(tmp_path / 'given' / 'config.json') as f:
    config = json.load(f)
  assert config['sampling_probability'] == 0.3
  assert summary.privacy['neighboring_relation'] == 'add_remove'
  assert summary.privacy['sampling']['rate'].startswith('given')
  acc = dp_accounting.rdp.RdpAccountant()
  z = records[0].queries[0].noise_stddev / records[0].queries[0].l2_norm_clip   # float32 0.8.
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.3, dp_accounting.GaussianDpEvent(z)), 2)
  assert summary.privacy['epsilon']['rdp'] == pytest.approx(acc.get_epsilon(
      config['delta_used']), rel=1e-9)


@pytest.mark.parametrize('task_name, options', [
    ('stackoverflow_tag', dict(word_vocab_size=200, tag_vocab_size=30)),
    ('stackoverflow_word', {})])
def test_compiled_evaluation_gives_keras_numbers(data_dir, task_name, options):
  """The evaluator's one-graph pass over the data (issue 53, item 5) gives what Keras' own
  evaluate gives on the same model, weights and data: the example-weighted loss and every
  metric, twice in a row (its metrics reset between evaluations)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tff_dp.training.builders import build_evaluation  # pylint: disable=g-import-not-at-top
  from tff_dp.training.builders import evaluation  # pylint: disable=g-import-not-at-top
  task = tasks.load(task_name, data_dir, client_batch_size=4, **options)
  data = build_evaluation.dataset(task, 60, seed=0)
  evaluator = evaluation.CentralizedEvaluator(task.keras_model_fn, task.loss_fn,
                                              task.metrics_fn, data)
  reference = task.keras_model_fn()
  reference.compile(loss=task.loss_fn(), metrics=task.metrics_fn())
  weights = [np.asarray(w) * 0.5 for w in reference.get_weights()]   # Not its initial ones.
  reference.set_weights(weights)
  expected = reference.evaluate(data, verbose=0, return_dict=True)
  for _ in range(2):
    found = evaluator.evaluate(weights)
    assert set(found) == set(expected)
    for name, value in expected.items():
      assert found[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
  # pylint: disable-next=protected-access  (the compiled pass, not the eager one, was checked)
  assert isinstance(evaluator._pass, tf.types.experimental.GenericFunction)
