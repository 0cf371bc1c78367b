"""Correlated noise fed to the process from beside it, one model-sized input per round.

A correlated-noise mechanism's noise state (a BLT's buffers, a banded strategy's last bands - 1
outputs, a tree's nodes) is many model copies. Held in the process's state, TFF would move all
of it between Python, the coordinator and the worker every round (docs/BENCHMARKS.md: 76x the
cost of one noise input at 64 bands on the StackOverflow LSTM). So the state holds one slot,
`FedNoise`: before each round the coordinator writes the round's noise w_t (`NoiseFeed.into`,
numpy: `matrix_factorization.streaming` or `.tree`), the round adds stddev x w_t to the clipped
sum and empties the slot. A round whose slot was not filled for it fails (`fed_round` must be
the round's number), so a process is never run without its noise.

Use it around `next` of any process whose state holds one such slot (a `tff.learning` process
built with `CorrelatedNoiseFactory` or `FtrlFactory`, or the factory's aggregation process
alone):

    feed = factory.noise_feed()
    state = process.initialize()
    for round_num in range(1, rounds + 1):
      output = process.next(feed.into(state, round_num), data)
      feed.commit(round_num)
      state = output.state

`feed.state()` / `feed.restore(saved)` carry the feed across a checkpoint; the seed and the
buffers are secrets of the run (they reveal the noise). The buffers are many model copies, and
a function of the seed and the round: `feed.state(with_buffers=False)` leaves them out, and
`restore` replays them from an earlier `feed.snapshot()` (the command line keeps one every
`noise_feed_hook.snapshot_every` rounds).
"""

import collections
import concurrent.futures
from typing import Optional

import attrs
import numpy as np
import tensorflow as tf

from tff_dp.matrix_factorization import streaming

FedNoise = collections.namedtuple(
    'FedNoise', ['l2_norm_clip', 'stddev', 'step', 'fed_round', 'noise'])
FedNoise.__doc__ = """The query state of a fed correlated-noise sum: the round's clip, the
stddev of its fresh draws, the rounds completed (`step`), the round the slot was filled for
(`fed_round`) and the noise w_t (the model's structure; zeros between rounds)."""

THREAD_NAME = 'tff_dp-noise-feed'   # A feed's thread that computes next rounds ahead.


class NoiseFeed:
  """Fills the `FedNoise` slot of a process state with each round's noise (module docstring).

  The feed holds the stream's state after the last committed round; `into` computes the next
  round's noise from it (a round abandoned before `commit` is fed again the same noise).

  `compute_ahead`: while a round runs (the coordinator waits on its worker), a thread computes
  the next round's noise from the round's pending state; `into` takes it only if that state
  was committed, so the noise is the same bits either way, a round earlier.
  """

  def __init__(self, stream, seed: int, *, compute_ahead: bool = True):
    self.stream = stream   # A `streaming.Stream` or a `tree.TreeStream`.
    self.seed = int(seed)
    self._committed: Optional[streaming.StreamState] = None
    self._size: Optional[int] = None   # The model's size (a stream state may hold no buffer).
    self._pending: Optional[streaming.StreamState] = None
    self._compute_ahead = compute_ahead
    self._ahead = None   # (seed, the state it advances, the future of its advance).
    self._thread: Optional[concurrent.futures.ThreadPoolExecutor] = None

  def start(self, state) -> None:
    """Sizes the feed to the model of `state` (before its first round, or a `restore`)."""
    self._size_to(_slot(state).noise)

  def _size_to(self, noise) -> None:
    if self._committed is None:
      self._size = _size(noise)
      self._committed = self.stream.start(self._size)

  def into(self, state, round_num: int):
    """`state` with its slot filled for round `round_num` (the round after the last commit)."""
    path = _slot_path(state)
    slot = _at(state, path)
    self._size_to(slot.noise)
    done = self._committed.step
    if round_num != done + 1:
      raise ValueError(f'the noise feed is after round {done}: it cannot feed round {round_num}')
    template = tf.nest.flatten(slot.noise)
    w, self._pending = self._next_round(_size(slot.noise))
    if self._compute_ahead:
      self._start_ahead(self._pending, _size(slot.noise))
    parts = np.split(w, np.cumsum([np.size(t) for t in template])[:-1])
    noise = tf.nest.pack_sequence_as(slot.noise, [
        p.reshape(np.shape(t)).astype(np.asarray(t).dtype, copy=False)
        for p, t in zip(parts, template)])
    return _replace_at(state, path, slot._replace(fed_round=np.int64(round_num), noise=noise))

  def _next_round(self, size: int) -> tuple[np.ndarray, streaming.StreamState]:
    """(w, the state after it) of the round after the last commit: computed ahead, if it was
    from that state and seed, else now."""
    ahead, self._ahead = self._ahead, None
    if ahead is not None and ahead[0] == self.seed and ahead[1] is self._committed:
      return ahead[2].result()
    return self._advance(self.seed, self._committed, size)

  def _start_ahead(self, base: streaming.StreamState, size: int) -> None:
    if self._thread is None:   # Its thread ends when the feed is dropped (the pool's weakref).
      self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=THREAD_NAME)
    self._ahead = (self.seed, base,
                   self._thread.submit(self._advance, self.seed, base, size))

  def _advance(self, seed: int, base: streaming.StreamState, size: int):
    """(w, the state after it) of the round after `base`: its draws are (seed, round)'s."""
    return self.stream.advance_round(base, streaming.round_draws(seed, base.step + 1, size))

  def commit(self, round_num: int) -> None:
    """Round `round_num`, fed by the last `into`, completed."""
    if self._pending is None or self._pending.step != round_num:
      raise ValueError(f'round {round_num} was not fed')
    self._committed, self._pending = self._pending, None

  def state(self, *, with_buffers: bool = True) -> collections.OrderedDict:
    """What a checkpoint holds of the feed (secret): seed, rounds done, buffers.

    `with_buffers=False` leaves the buffers out: `restore` then rebuilds them from an earlier
    round's (`snapshot`) and the seed, and a checkpoint costs the model, not the many model
    copies the buffers are.
    """
    committed = self._committed
    saved = collections.OrderedDict(seed=np.int64(self.seed), step=np.int64(committed.step))
    if with_buffers:
      saved['buffers'] = list(committed.buffers)
    return saved

  def snapshot(self) -> streaming.StreamState:
    """The stream after the last committed round (its buffers are a secret of the run)."""
    return self._committed

  def restore(self, saved, snapshot: Optional[streaming.StreamState] = None) -> int:
    """The feed as `state()` saved it; the rounds replayed to rebuild its buffers.

    A state saved without its buffers is rebuilt from `snapshot` (the stream after an earlier
    round of the same seed; None: the start, for which the feed must have been sized by
    `start`) by replaying the rounds between. Round t's draws are a function of (seed, t) and
    `advance` is deterministic, so the rebuilt buffers are bit-identical to the uninterrupted
    run's.
    """
    self.seed = int(saved['seed'])
    step = int(saved['step'])
    self._pending = self._ahead = None
    if 'buffers' in saved:
      self._committed = streaming.StreamState(
          step, tuple(np.asarray(b) for b in saved['buffers']))
      return 0
    start = snapshot if snapshot is not None else self._start_of_stream()
    if start.step > step:
      raise ValueError(f'a snapshot of round {start.step} cannot rebuild round {step}')
    state = start
    while state.step < step:
      _, state = self._advance(self.seed, state, self._size or _buffer_size(start))
    self._committed = state
    return step - start.step

  def _start_of_stream(self) -> streaming.StreamState:
    if self._size is None:
      raise ValueError('size the feed (`start`) before restoring a state saved without buffers')
    return self.stream.start(self._size)


def _buffer_size(state: streaming.StreamState) -> int:
  """The model size a stream state's buffers hold (0 for a stream without buffers)."""
  return state.buffers[0].size if state.buffers else 0


def for_factory(factory) -> Optional[NoiseFeed]:
  """A new feed for the processes `factory` builds; None when their noise is not fed (every
  factory but the correlated-noise and tree ones: `CorrelatedNoiseFactory.noise_feed`,
  `FtrlFactory.noise_feed`)."""
  make_feed = getattr(factory, 'noise_feed', None)
  return make_feed() if make_feed is not None else None


def with_zero_noise(state, round_num: int = 1):
  """`state` with its slot filled with zeros for `round_num`: for a dry run that only reads
  the round's measurements (nothing it outputs is released)."""
  path = _slot_path(state)
  return _replace_at(state, path, _at(state, path)._replace(fed_round=np.int64(round_num)))


def without_noise(state):
  """`state` with its slot's noise replaced by empty arrays of the same dtypes and ranks: the
  slot is zeros between rounds, so a checkpoint need not hold it (`with_noise_of` refills it).
  A state without a slot is returned as it is."""
  if not holds_fed_noise(state):
    return state
  path = _slot_path(state)
  slot = _at(state, path)
  empty = tf.nest.map_structure(
      lambda t: np.zeros((0,) * np.ndim(t), np.asarray(t).dtype), slot.noise)
  return _replace_at(state, path, slot._replace(noise=empty))


def with_noise_of(state, like):
  """`state` with its slot's noise taken from `like` (a state of the same process between
  rounds, whose slot holds zeros): undoes `without_noise`."""
  if not holds_fed_noise(state):
    return state
  path = _slot_path(state)
  return _replace_at(state, path, _at(state, path)._replace(noise=_at(like, path).noise))


def holds_fed_noise(state) -> bool:
  return bool(_slot_paths(state))


def _size(noise) -> int:
  return int(sum(np.size(t) for t in tf.nest.flatten(noise)))


def _slot(state) -> FedNoise:
  return _at(state, _slot_path(state))


def _slot_path(state) -> tuple:
  """The keys from `state` down to its one `FedNoise` slot."""
  found = _slot_paths(state)
  if len(found) != 1:
    raise ValueError(f'a noise feed needs a process state with one FedNoise slot, found '
                     f'{len(found)}')
  return found[0]


def _slot_paths(value, path: tuple = ()) -> list:
  if _is_slot(value):
    return [path]
  return [p for key, child in _children(value) for p in _slot_paths(child, path + (key,))]


def _is_slot(value) -> bool:
  return getattr(value, '_fields', None) == FedNoise._fields


def _children(value) -> list:
  """[(key, child)]: attrs fields by name, dict items, sequence items by index."""
  if attrs.has(type(value)):
    return [(f.name, getattr(value, f.name)) for f in attrs.fields(type(value))]
  if isinstance(value, dict):
    return list(value.items())
  if isinstance(value, (list, tuple)):
    return list(enumerate(value))
  return []


def _at(value, path: tuple):
  for key in path:
    value = getattr(value, key) if attrs.has(type(value)) else value[key]
  return value


def _replace_at(value, path: tuple, slot):
  """`value` with the slot at `path` replaced by `slot` (only the containers on the path are
  rebuilt)."""
  if not path:
    return slot
  key, rest = path[0], path[1:]
  if attrs.has(type(value)):
    return attrs.evolve(value, **{key: _replace_at(getattr(value, key), rest, slot)})
  if isinstance(value, dict):
    return type(value)((k, _replace_at(v, rest, slot) if k == key else v)
                       for k, v in value.items())
  items = [_replace_at(v, rest, slot) if i == key else v for i, v in enumerate(value)]
  return type(value)(*items) if hasattr(value, '_fields') else type(value)(items)
