"""Checkpoints of a correlated-noise run without its noise state (issue 53): the checkpoint
holds the feed's seed and step, the buffers are snapshotted every few rounds, and a resume
replays the rounds since the newest snapshot. Oracles: the uninterrupted feed (bit for bit)
and C^-1 applied to the draws of (seed, round), solved densely."""

import os
import threading

import numpy as np
import pytest

from tff_dp import mechanisms
from tff_dp.aggregators import noise_feed
from tff_dp.matrix_factorization import streaming
from tff_dp.matrix_factorization import toeplitz
from tff_dp.accounting import correlated
from tff_dp.training.rounds import noise_feed_hook
from tff_dp.training.run_state import checkpointing
from tff_dp.training.run_state import round_hooks
from tff_dp.training.run_state import run_dir

ROUNDS, SHAPES, SEED = 12, [(40,), (3, 5)], 11
SCHEDULE = dict(rounds=ROUNDS, min_separation=3, max_participations=4)


def _factory(kind):
  if kind == 'ftrl':   # Trees of 8 rounds: the snapshot of round 8 holds no node.
    return mechanisms.build_aggregator(kind, noise_multiplier=1.0, clients_per_round=1.0,
                                       clip=1.0, noise_seed=SEED, rounds_per_epoch=8)
  own = {'bands': 4} if kind == 'bandmf' else {}
  return mechanisms.build_aggregator(kind, noise_multiplier=1.0, clients_per_round=1.0,
                                     clip=1.0, noise_seed=SEED, **own, **SCHEDULE)


def _state():
  """A process state reduced to its `FedNoise` slot (what the feed reads and fills)."""
  return {'slot': noise_feed.FedNoise(np.float32(1), np.float32(1), np.int64(0), np.int64(0),
                                      [np.zeros(s, np.float32) for s in SHAPES])}


def _round(num):
  return round_hooks.Round(num=num, is_last=False, is_eval=False, trained_state=None,
                           state=None, row={}, weights_fn=list)


def _run(hook, rounds):
  """Each round's noise, flat, as the hook feeds it."""
  noise = []
  for r in rounds:
    fed = hook.before_round(r, _state())
    noise.append(np.concatenate([np.ravel(x) for x in fed['slot'].noise]))
    hook.after_round(_round(r))
  return noise


@pytest.mark.parametrize('kind', ['blt', 'bandmf', 'ftrl'])
@pytest.mark.parametrize('stop_after', [1, 5, 8, 11])
def test_a_resume_rebuilds_the_noise_state_bit_for_bit(kind, stop_after, tmp_path):
  """Stopped after any round (before the first snapshot, just after one, between two), a run
  resumed from its checkpoint's entries feeds the uninterrupted run's noise exactly (the
  tree's too, from a snapshot after a tree's last round, which holds no node)."""
  factory = _factory(kind)
  whole_hook = noise_feed_hook.NoiseFeedHook(factory.noise_feed(), str(tmp_path / 'whole'))
  whole_hook.start(None, _state())
  whole = _run(whole_hook, range(1, ROUNDS + 1))

  folder = str(tmp_path / 'part')
  hook = noise_feed_hook.NoiseFeedHook(factory.noise_feed(), folder)
  hook.start(None, _state())
  first = _run(hook, range(1, stop_after + 1))
  entries = hook.checkpoint_entries()
  lines = []
  resumed = noise_feed_hook.NoiseFeedHook(factory.noise_feed(), folder, log=lines.append)
  resumed.start(None, _state())
  resumed.restore(entries, None, _state())
  rest = _run(resumed, range(stop_after + 1, ROUNDS + 1))
  for r, (a, b) in enumerate(zip(whole, first + rest), 1):
    assert np.array_equal(a, b), f'round {r}'
  every = noise_feed_hook.snapshot_every(factory.stream.num_buffers)
  snapshot = stop_after // every * every
  assert lines == [f'noise state: rebuilt after round {stop_after} from '
                   + (f'the snapshot of round {snapshot}' if snapshot else 'the start')
                   + f' ({stop_after - snapshot} rounds replayed from the seed)']
  if kind == 'ftrl':
    assert every == 8   # Its law against tfp's tree: tests/test_tree_noise.py.
    return
  draws = np.stack([streaming.fresh_draws(SEED, r, whole[0].size) for r in range(1, ROUNDS + 1)])
  np.testing.assert_allclose(np.stack(whole), np.linalg.solve(
      toeplitz.materialize(correlated.coefs_of(factory.strategy), ROUNDS), draws),
      rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('kind', ['blt', 'bandmf'])
def test_checkpoints_hold_no_buffers_and_the_snapshots_are_few(kind, tmp_path):
  """The checkpoint's entries are the seed and the step (no leaf per buffer: TFF traces a
  checkpoint anew at a cost per leaf); the snapshot folder holds the two newest snapshots,
  owner-only, with the buffers after their rounds."""
  factory = _factory(kind)
  folder = str(tmp_path / 'snapshots')
  hook = noise_feed_hook.NoiseFeedHook(factory.noise_feed(), folder, every=2)
  hook.start(None, _state())
  _run(hook, range(1, 8))
  saved = hook.checkpoint_entries()[noise_feed_hook.KEY]
  assert factory.stream.num_buffers >= 1
  assert list(saved) == ['seed', 'step'] and (int(saved['seed']), int(saved['step'])) == (SEED, 7)
  assert sorted(os.listdir(folder)) == ['round_00000004.npz', 'round_00000006.npz']
  assert all(os.stat(os.path.join(folder, n)).st_mode & 0o777 == 0o600
             for n in os.listdir(folder))
  replay = factory.noise_feed()
  replay.start(_state())
  replay.restore(dict(saved, step=np.int64(6)))   # From the start: the oracle of round 6.
  snapshot = noise_feed_hook.newest_snapshot(folder, SEED, 6)
  assert snapshot.step == 6
  for a, b in zip(snapshot.buffers, replay.snapshot().buffers):
    assert np.array_equal(a, b) and a.size == sum(int(np.prod(s)) for s in SHAPES)
  assert noise_feed_hook.newest_snapshot(folder, SEED + 1, 7) is None   # Another seed's.
  assert noise_feed_hook.newest_snapshot(folder, SEED, 3) is None


def test_a_checkpoint_in_neither_structure_reports_the_mismatch_with_todays(tmp_path):
  """A checkpoint that loads neither in today's structure nor in the earlier one is refused
  with today's mismatch (the earlier structure's would send a user after an old version)."""
  hook = noise_feed_hook.NoiseFeedHook(_factory('bandmf').noise_feed(), str(tmp_path / 'n'))
  hook.start(None, _state())
  run = run_dir.RunDirectory(str(tmp_path), 'other', resume=False)
  run.create(secret_checkpoints=True, tensorboard=False)
  other = checkpointing.program_state(_state(), 3, [])
  other['unknown'] = np.zeros(2, np.float32)   # Written by neither version.
  run.save_checkpoint(other, 3)
  run.close()
  reopened = run_dir.RunDirectory(str(tmp_path), 'other', resume=True)
  reopened.create(secret_checkpoints=True, tensorboard=False)
  try:
    with pytest.raises((ValueError, TypeError)) as today:
      reopened.load_latest_checkpoint(checkpointing.program_state(_state(), 0, [hook]))
    with pytest.raises((ValueError, TypeError)) as caught:
      checkpointing.load_latest(reopened, _state(), [hook])
  finally:
    reopened.close()
  assert type(caught.value) is type(today.value) and str(caught.value) == str(today.value)


def test_a_checkpoint_with_buffers_still_resumes_without_replay(tmp_path):
  """A run directory checkpointed before issue 53 holds the buffers and the slot's zeros in
  every checkpoint: the run directory loads it in that earlier structure, and the resumed feed
  continues the uninterrupted noise from its buffers, replaying nothing."""
  factory = _factory('bandmf')
  feed = factory.noise_feed()
  old_hook = noise_feed_hook.NoiseFeedHook(feed, str(tmp_path / 'unused'))
  old_hook.start(None, _state())
  _run(old_hook, range(1, 4))
  run = run_dir.RunDirectory(str(tmp_path), 'old', resume=False)
  run.create(secret_checkpoints=True, tensorboard=False)
  old_layout = checkpointing.program_state(_state(), 3, [])
  old_layout[noise_feed_hook.KEY] = feed.state()   # The buffers, as issue 40 saved them.
  run.save_checkpoint(old_layout, 3)
  run.close()

  lines = []
  hook = noise_feed_hook.NoiseFeedHook(factory.noise_feed(), str(tmp_path / 'none'),
                                       log=lines.append)
  hook.start(None, _state())
  reopened = run_dir.RunDirectory(str(tmp_path), 'old', resume=True)
  reopened.create(secret_checkpoints=True, tensorboard=False)
  loaded = checkpointing.load_latest(reopened, _state(), [hook])
  reopened.close()
  assert int(loaded['round_num']) == 3 and len(loaded[noise_feed_hook.KEY]['buffers']) == 3
  hook.restore(loaded, None, hook.restored_state(loaded['state'], _state()))
  assert lines == []   # Nothing replayed.
  a, b = feed.into(_state(), 4), hook.before_round(4, _state())
  for x, y in zip(a['slot'].noise, b['slot'].noise):
    assert np.array_equal(x, y)


def test_a_snapshot_after_the_checkpoint_is_refused():
  factory = _factory('blt')
  feed = factory.noise_feed()
  feed.start(_state())
  later = streaming.StreamState(5, tuple(b for b in feed.snapshot().buffers))
  with pytest.raises(ValueError, match='snapshot of round 5 cannot rebuild round 3'):
    feed.restore(dict(feed.state(with_buffers=False), step=np.int64(3)), later)


def test_checkpoints_leave_out_the_slots_zeros_and_a_resume_refills_them(tmp_path):
  """The slot is zeros between rounds: a checkpoint holds empty arrays of its dtypes and ranks
  in its place (every other leaf as it is), and the resumed state has the zeros back."""
  hook = noise_feed_hook.NoiseFeedHook(_factory('blt').noise_feed(), str(tmp_path))
  state = dict(_state(), weights=[np.ones(7, np.float32)])
  saved = hook.checkpoint_state(state)
  assert [(x.shape, x.dtype) for x in saved['slot'].noise] == [((0,), np.float32),
                                                              ((0, 0), np.float32)]
  assert saved['weights'] is state['weights'] and saved['slot'].stddev == 1
  back = hook.restored_state(saved, _state())
  assert [x.shape for x in back['slot'].noise] == SHAPES
  assert not any(np.any(x) for x in back['slot'].noise)
  assert back['weights'] is state['weights']


@pytest.mark.parametrize('kind', ['blt', 'bandmf'])
def test_noise_computed_ahead_is_the_noise_computed_in_turn(kind):
  """With a round abandoned (fed, not committed, fed again) and a restore from a checkpoint's
  entries midway, the feed that computes each next round ahead feeds the bits of one that
  does not."""
  threads = {False: [], True: []}   # The threads each feed's steps ran in.

  def recording(ahead):
    stream = _factory(kind).stream
    advance = stream.advance
    def recorded(state, z):
      threads[ahead].append(threading.current_thread().name)
      return advance(state, z)
    object.__setattr__(stream, 'advance', recorded)   # A frozen dataclass.
    return stream
  feeds = [noise_feed.NoiseFeed(recording(ahead), SEED, compute_ahead=ahead)
           for ahead in (False, True)]
  noise = {False: [], True: []}
  for ahead, feed in zip((False, True), feeds):
    feed.start(_state())
    for r in range(1, ROUNDS + 1):
      if r == 4:
        feed.into(_state(), r)   # Abandoned: the thread's next round is from a state never
        saved = feed.state(with_buffers=False)   # committed.
      if r == 7:
        feed.restore(saved)   # Back to round 3's state, replayed from the start.
        for again in range(4, 7):
          feed.into(_state(), again)
          feed.commit(again)
      fed = feed.into(_state(), r)
      feed.commit(r)
      noise[ahead].append(np.concatenate([np.ravel(x) for x in fed['slot'].noise]))
  for r, (a, b) in enumerate(zip(noise[False], noise[True]), 1):
    assert np.array_equal(a, b), f'round {r}'
  # The feed that does not compute ahead stepped in this thread; the other fed rounds 2-12
  # from its own (the abandoned round 4 and the restore's replay aside).
  assert set(threads[False]) == {threading.current_thread().name}
  assert sum(name.startswith(noise_feed.THREAD_NAME) for name in threads[True]) >= ROUNDS - 2
