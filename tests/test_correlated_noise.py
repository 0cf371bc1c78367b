"""Correlated-noise DP-FTRL in training (issue 27.2-27.4): the `blt` / `bandmf` factories, the
min-separation sampler, the ledger and the accounting of a real run. Oracles: TFF's own fixed
factory with noise off, dense C^-1 C^-T for the noise covariance, brute force over
participation patterns and dp_accounting for every epsilon."""

import collections
import functools
import json
import os

import attrs
import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff

from tff_dp import aggregators
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp import run_format
from tff_dp import sampling
from tff_dp.accounting import correlated
from tff_dp.aggregators import noise_feed
from tff_dp.aggregators import tree_aggregation
from tff_dp.matrix_factorization import streaming
from tff_dp.matrix_factorization import toeplitz
from run_helpers import main_in_process
from run_helpers import run_stopped_after
from test_matrix_factorization import _brute_force_sensitivity

SCHEDULE = dict(rounds=6, min_separation=2, max_participations=3)


def _process(factory, shapes):
  return factory.create(tff.to_type([(np.float32, list(s)) for s in shapes]))


@pytest.mark.parametrize('kind', ['blt', 'bandmf'])
def test_with_noise_off_the_factories_are_tffs_fixed_clip_mean(kind):
  shapes, m = [(3,), (2,)], 4
  factory = mechanisms.build_aggregator(
      kind, noise_multiplier=0.0, clients_per_round=float(m), clip=0.7, **SCHEDULE)
  ours = _process(factory, shapes)
  theirs = _process(tff.aggregators.DifferentiallyPrivateFactory.gaussian_fixed(
      noise_multiplier=0.0, clients_per_round=float(m), clip=0.7), shapes)
  feed = factory.noise_feed()
  rng = np.random.default_rng(0)
  s_ours, s_theirs = ours.initialize(), theirs.initialize()
  for r in range(1, 4):
    clients = [[rng.normal(size=s).astype(np.float32) * 2 for s in shapes] for _ in range(m)]
    a, b = ours.next(feed.into(s_ours, r), clients), theirs.next(s_theirs, clients)
    feed.commit(r)
    s_ours, s_theirs = a.state, b.state
    for x, y in zip(a.result, b.result):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('kind', ['blt', 'bandmf'])
def test_the_noise_is_the_strategys_inverse_applied_to_fresh_draws(kind):
  """Zero updates, 20,000 coordinates: the rounds' noise has covariance stddev^2 C^-1 C^-T /
  m^2, and each round reports stddev = z x clip x sensitivity."""
  n, z, clip, m = SCHEDULE['rounds'], 0.8, 0.5, 2.0
  factory = mechanisms.build_aggregator(kind, noise_multiplier=z, clients_per_round=m,
                                            clip=clip, **SCHEDULE)
  coefs = correlated.coefs_of(factory.strategy)
  sens2 = toeplitz.sensitivity_squared_brute_force(toeplitz.materialize(coefs, n), 2, 3)
  assert factory.stddev == pytest.approx(z * clip * sens2 ** 0.5, rel=1e-9)
  process, feed = _process(factory, [(20000,)]), factory.noise_feed()
  state, rounds = process.initialize(), []
  for r in range(1, n + 1):
    out = process.next(feed.into(state, r), [[np.zeros(20000, np.float32)]])
    feed.commit(r)
    state = out.state
    rounds.append(np.asarray(out.result[0]) * m / factory.stddev)
    reported = out.measurements['privacy_queries']['update']
    assert float(reported['noise_stddev']) == pytest.approx(factory.stddev, rel=1e-6)
    assert float(reported['l2_norm_clip']) == pytest.approx(clip)
  inverse = np.linalg.inv(toeplitz.materialize(coefs, n))
  expected = inverse @ inverse.T
  # Each entry within 5 standard errors of a sample covariance of 20,000 Gaussian draws.
  diagonal = np.diag(expected)
  stderr = np.sqrt((np.outer(diagonal, diagonal) + expected ** 2) / 20000)
  assert np.all(np.abs(np.cov(np.stack(rounds)) - expected) < 5 * stderr)


def test_a_round_whose_noise_was_not_fed_fails_and_the_feed_is_exact():
  """The noise state stays beside the process (aggregators.noise_feed): a round the feed did not
  fill for fails; a round fed twice (abandoned, then run) gets the same noise; a feed restored
  from a checkpoint's entries continues the uninterrupted noise, which is C^-1 applied to the
  draws of (seed, round)."""
  n, shapes = SCHEDULE['rounds'], [(3,), (2,)]
  factory = mechanisms.build_aggregator('bandmf', noise_multiplier=1.0, clients_per_round=1.0,
                                        clip=1.0, bands=3, noise_seed=5, **SCHEDULE)
  process = _process(factory, shapes)
  zeros = [[np.zeros(s, np.float32) for s in shapes]]
  with pytest.raises(Exception, match='noise of this round was not fed'):
    process.next(process.initialize(), zeros)
  feed, state, noise = factory.noise_feed(), process.initialize(), []
  for r in range(1, n + 1):
    if r == 3:
      saved = feed.state()
      abandoned = feed.into(state, r)   # A round abandoned by a stop: not committed.
    out = process.next(feed.into(state, r), zeros)
    feed.commit(r)
    state = out.state
    noise.append(np.concatenate([np.ravel(x) for x in out.result]) / factory.stddev)
  assert feed.seed == 5
  with pytest.raises(ValueError, match='cannot feed round 2'):
    feed.into(state, 2)
  flat = lambda s: np.concatenate([np.ravel(x) for x in s.query_state.numerator_state.noise])
  np.testing.assert_allclose(flat(abandoned), noise[2], rtol=1e-5, atol=1e-6)
  resumed = factory.noise_feed()
  resumed.restore(saved)   # The feed as the checkpoint of round 2 holds it.
  np.testing.assert_allclose(flat(resumed.into(state, 3)), noise[2], rtol=1e-5, atol=1e-6)
  draws = np.stack([streaming.fresh_draws(5, r, 5) for r in range(1, n + 1)])
  coefs = correlated.coefs_of(factory.strategy)
  np.testing.assert_allclose(np.stack(noise), np.linalg.solve(
      toeplitz.materialize(coefs, n), draws), rtol=1e-4, atol=1e-5)


def test_the_feed_fills_the_one_slot_at_any_depth_and_nothing_else():
  """A learning process's state nests the slot in attrs classes, dicts, namedtuples and lists;
  the feed replaces the slot alone (every other leaf is the same object) and is made only for
  a factory whose noise is fed."""
  Outer = attrs.make_class('Outer', ['global_model_weights', 'aggregator'], frozen=True)
  Pair = collections.namedtuple('Pair', ['clip', 'query'])
  slot = noise_feed.FedNoise(np.float32(1), np.float32(1), np.int64(0), np.int64(0),
                             [np.zeros(3, np.float32), np.zeros((1, 2), np.float32)])
  weights = [np.ones(3, np.float32)]
  state = Outer(weights, collections.OrderedDict(
      norm=np.float32(2), inner=Pair(np.float32(3), [np.int32(4), slot])))
  factory = mechanisms.build_aggregator('blt', noise_multiplier=1.0, clients_per_round=1.0,
                                        clip=1.0, noise_seed=7, **SCHEDULE)
  feed = noise_feed.for_factory(factory)
  fed = feed.into(state, 1)
  filled = fed.aggregator['inner'].query[1]
  assert filled.fed_round == 1 and filled.step == 0
  assert [np.shape(x) for x in filled.noise] == [(3,), (1, 2)]
  assert np.any(np.concatenate([np.ravel(x) for x in filled.noise]) != 0)
  assert fed.global_model_weights is weights
  assert fed.aggregator['norm'] is state.aggregator['norm']
  assert fed.aggregator['inner'].query[0] is state.aggregator['inner'].query[0]
  assert type(fed.aggregator) is collections.OrderedDict and type(fed.aggregator['inner']) is Pair
  assert noise_feed.holds_fed_noise(state)
  assert not noise_feed.holds_fed_noise(state.aggregator['inner'].query[0])
  with pytest.raises(ValueError, match='found 2'):
    feed.into([state, state], 1)
  assert noise_feed.for_factory(mechanisms.build_aggregator(
      'fixed', noise_multiplier=1.0, clients_per_round=1.0, clip=1.0)) is None


def test_the_min_separation_sampler_visits_every_client_every_cycle():
  ids = [f'c{i}' for i in range(23)]
  sampler = sampling.MinSeparationSampler(ids, 5, seed=1)
  assert sampler.min_separation == 4   # 23 // 5 blocks; 3 clients never sampled.
  seen = {}
  for r in range(1, 13):
    for c in sampler.sample(r):
      seen.setdefault(c, []).append(r)
    assert sampler.sampling_event(r).kind == 'min_separation'
  assert len(seen) == 20
  assert all(b - a == 4 for rounds in seen.values() for a, b in zip(rounds, rounds[1:]))


BASE = ['--task=stackoverflow_tag', '--clip=0.5', '--noise_multiplier=1.0',
        '--clients_per_round=4', '--client_sampling=min_separation', '--total_rounds=7',
        '--max_eval_examples=20', '--client_batch_size=8', '--so_vocab_size=200',
        '--so_tag_vocab_size=30', '--delta=1e-3']


def _epsilons(run):
  with open(run / 'metrics.csv') as f:
    header, *lines = [line.strip().split(',') for line in f]
  return [float(line[header.index('epsilon_rdp')]) for line in lines]


def _brute_sensitivity(coefs, t, b, k):
  return _brute_force_sensitivity(toeplitz.materialize(coefs, t), b, k) ** 0.5


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_blt_run_records_its_strategy_and_is_accounted_as_one_gaussian(tag_data_dir,
                                                                           tmp_path):
  root = tmp_path / 'runs'
  code, out, err = main_in_process('run_experiment.py', BASE + [
      '--dp=blt', f'--data_dir={tag_data_dir}', f'--root_output_dir={root}',
      '--experiment_name=b1', '--accounting=rdp'])
  assert code == 0, err[-2000:]
  run = root / 'b1'
  records = ledger_lib.read_ledger(str(run / 'ledger.jsonl'))
  noise = records[0].correlated
  # 20 clients, 4 per round: every 5 rounds, so over 7 rounds at most twice.
  assert (noise.mechanism, noise.min_separation, noise.max_participations) == ('blt', 5, 2)
  assert noise.buf_decay and all(0 < d < 1 for d in noise.buf_decay)
  coefs = correlated.coefs_of(noise)
  ratio = records[0].queries[0].noise_stddev / records[0].queries[0].l2_norm_clip
  sens = [_brute_sensitivity(coefs, t, 5, 2) for t in range(1, 8)]
  assert ratio == pytest.approx(1.0 * sens[-1], rel=1e-6)   # z x sens_n.
  eps = _epsilons(run)
  assert len(eps) == 7
  for t, value in enumerate(eps, 1):
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(ratio / sens[t - 1]))
    assert value == pytest.approx(acc.get_epsilon(1e-3), rel=1e-6)
  assert os.path.isdir(run / 'secret' / 'checkpoints') and not os.path.exists(run / 'checkpoints')
  summary = json.loads((run / 'summary.json').read_text())
  assert 'correlated noise' in summary['privacy']['mechanism']
  assert any(s.startswith('secret/checkpoints/') for s in summary['privacy']['secrets'])


@pytest.mark.parametrize('extra, message', [
    (['--dp=blt', '--client_sampling=poisson'], 'client_sampling=min_separation'),
    (['--dp=fixed'], 'dp=blt'),
    (['--dp=ftrl'], 'client_sampling=shuffled'),
    (['--dp=bandmf', '--min_separation=9'], '--min_separation <= 5'),
    (['--dp=blt', '--max_participations=1'], '--max_participations >= 2'),
    (['--dp=blt', '--bands=3'], 'dp=bandmf'),
])
def test_what_the_accounting_cannot_analyse_is_refused_before_anything_is_written(
    extra, message, tag_data_dir, tmp_path):
  code, _, err = main_in_process('run_experiment.py', BASE + extra + [
      f'--data_dir={tag_data_dir}', f'--root_output_dir={tmp_path / "runs"}'])
  assert code == 2 and message in err, err[-2000:]
  assert not os.path.exists(tmp_path / 'runs')


@pytest.mark.parametrize('kind', ['blt', 'bandmf'])
@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_resumed_run_feeds_the_uninterrupted_noise_and_gives_its_model(kind, tag_task,
                                                                        tmp_path, monkeypatch):
  """Stopped after round 5 and resumed to round 7, with noise on and both runs given one noise
  seed: the noise state (rebuilt from the checkpoint's seed and the newest snapshot,
  noise_feed_hook), the seeded samples and the server optimizer continue, so the final model,
  the ledger and the epsilon curve are the uninterrupted run's. The BLT run is stopped by a
  signal between rounds; the BandMF run by `max_epsilon`, whose curve grows every round, and it
  resumes under a raised cap."""
  monkeypatch.setattr(tree_aggregation, 'noise_seed', lambda seed: 77)
  settings = dict(root_output_dir=str(tmp_path), task='stackoverflow_tag', total_rounds=7,
                  clients_per_round=4, dp=kind, clip=0.5, noise_multiplier=1.0,
                  client_sampling='min_separation', server_momentum=0.9, seed=3,
                  sampling_seed=5, max_eval_examples=20, delta=1e-3, accounting=('rdp',))
  run = functools.partial(run_stopped_after, settings, tag_task)

  whole = run('whole')
  whole_eps = _epsilons(tmp_path / 'whole')
  if kind == 'blt':
    stopped = run('part', stop_after=5)
  else:
    assert whole_eps[4] < whole_eps[5]
    stopped = run_stopped_after(dict(settings, max_epsilon=whole_eps[4] * 1.0001), tag_task,
                                'part')
  assert stopped.rounds_completed == 5
  resumed = run_stopped_after(dict(settings, max_epsilon=100.0), tag_task, 'part', resume=True)
  assert resumed.rounds_completed == 7
  for a, b in zip(whole.final_state.global_model_weights.trainable,
                  resumed.final_state.global_model_weights.trainable):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  # This BLT's one buffer is snapshotted every 2 rounds (the resume replayed round 5 from
  # round 4's; the two newest are kept); 5 bands' 4 buffers every 8 (none: the resume
  # replayed rounds 1-5).
  snapshots = tmp_path / 'part' / 'secret' / run_format.NOISE_SNAPSHOTS_FOLDER
  assert sorted(os.listdir(snapshots) if snapshots.exists() else []) == (
      ['round_00000004.npz', 'round_00000006.npz'] if kind == 'blt' else [])
  records = ledger_lib.read_ledger(str(tmp_path / 'part' / 'ledger.jsonl'))
  assert [r.round_num for r in records] == list(range(1, 8))
  whole_records = ledger_lib.read_ledger(str(tmp_path / 'whole' / 'ledger.jsonl'))
  assert [r.correlated for r in records] == [r.correlated for r in whole_records]
  assert _epsilons(tmp_path / 'part') == pytest.approx(whole_eps, rel=1e-9)
  # The strategy is planned for total_rounds: it cannot change on resume.
  code, _, err = main_in_process('run_experiment.py', [
      f'--root_output_dir={tmp_path}', '--experiment_name=part', '--resume', '--total_rounds=9'])
  assert code == 2 and 'total_rounds' in err, err[-2000:]
