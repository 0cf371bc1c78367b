# Longer than 350 lines: TFF's on-disk format for two dataset families (EMNIST,
# StackOverflow with its word and tag counts), written the way TFF's loaders read them.
"""Small, seeded, learnable datasets written in TFF's exact on-disk format.

The files are what `tff.simulation.datasets.{emnist,stackoverflow}.load_data(cache_dir=...)`
read after downloading: an SQLite database with tables
`examples(split_name, client_id, serialized_example_proto)` and
`client_metadata(client_id, split_name, num_examples)` (plus an index on
`examples(split_name, client_id)` for per-client reads), whose protos are `tf.train.Example`s
with the same features and dtypes as the real data, under the same split names and file
names. StackOverflow also gets the extracted word/tag count files (see tasks/vocab.py). The real
loaders therefore run unchanged on them; they back the embedded demo dataset and the tests.

Full-size populations (`FULL_SIZES`: StackOverflow's 342,477 training clients, EMNIST's 3,400
writers) come from the same generators, streamed to disk in batches; they are never in git:
`python -m tasks.synthetic_data --family=stackoverflow --population=full --cache_dir=DIR`
generates one on demand (benchmarks/bench_population.py caches them under
~/.cache/tff_dp/population).
"""

import argparse
import collections
import contextlib
import fcntl
import os
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from typing import Iterable, Iterator, Mapping, Sequence, Tuple, Union


def _end_during_start_up(signum, frame):
  """The command's Ctrl-C or SIGTERM while it imports TensorFlow: nothing is written yet, so
  the process ends at once (a KeyboardInterrupt raised inside that import can be swallowed)."""
  del frame
  os.write(2, b'stopped by a signal during start-up: nothing was written\n')
  os._exit(128 + signum)   # pylint: disable=protected-access


if __name__ == '__main__':   # Only as the command: importing the module changes nothing.
  for _signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_signum, _end_during_start_up)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tasks import data_files  # noqa: E402  (after the start-up handlers)
from tasks import emnist as emnist_task  # noqa: E402
from tasks import registry  # noqa: E402
from tasks import stackoverflow as so_task  # noqa: E402
from tff_dp.errors import UserInputError  # noqa: E402

# Embedded default sizes: big enough to learn something in a demo, small enough for seconds.
DEFAULT_SIZES = {
    'emnist': dict(num_train_clients=100, examples_per_client=60, num_test_clients=20),
    'stackoverflow': dict(num_train_clients=60, examples_per_client=40, num_test_clients=20,
                          num_heldout_clients=10),
}
_MARKER = data_files.EMBEDDED_MARKER
# Set by the command's Ctrl-C (`_stop`): the writer checks it between clients and inside SQLite's
# statements, since a KeyboardInterrupt raised inside TensorFlow's proto code or a gc callback
# can be swallowed (a loaded machine's generator once ran on for 30 s after its Ctrl-C).
STOP = threading.Event()


def _stop(signum, frame):
  del signum, frame
  STOP.set()
  raise KeyboardInterrupt


# The real datasets' client counts (TFF's StackOverflow: 342,477 train / 38,758 heldout /
# 204,088 test clients; EMNIST: 3,400 writers in both splits) with few examples per client, so
# that the population, not the data volume, is what is full-size.
FULL_SIZES = {
    'emnist': dict(num_train_clients=3400, examples_per_client=20, num_test_clients=3400),
    'stackoverflow': dict(num_train_clients=342477, examples_per_client=2,
                          num_test_clients=204088, num_heldout_clients=38758),
}


# ---------------------------------------------------------------------------------------------
# Format: tf.Example protos and the SQLite tables.

def _bytes(values: Sequence[bytes]) -> tf.train.Feature:
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _int64(values: Sequence[int]) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _float(values: Iterable[float]) -> tf.train.Feature:
  # tolist() gives the same Python floats as float(v) per element, 3x faster.
  values = values.tolist() if isinstance(values, np.ndarray) else [float(v) for v in values]
  return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def emnist_example(pixels: np.ndarray, label: int) -> bytes:
  """EMNIST proto: `pixels` float32 [28, 28] (row-major), `label` int64."""
  assert pixels.shape == (28, 28)
  return tf.train.Example(features=tf.train.Features(feature={
      'pixels': _float(np.asarray(pixels, np.float32).ravel()),
      'label': _int64([label]),
  })).SerializeToString()


def stackoverflow_example(*, tokens: str, title: str, tags: str, score: int = 0,
                          creation_date: str = '2010-01-01 00:00:00 UTC',
                          type_: str = 'question') -> bytes:
  """StackOverflow proto: string features and an int64 score, as in the real file."""
  return tf.train.Example(features=tf.train.Features(feature={
      'creation_date': _bytes([creation_date.encode()]),
      'score': _int64([score]),
      'tags': _bytes([tags.encode()]),
      'title': _bytes([title.encode()]),
      'tokens': _bytes([tokens.encode()]),
      'type': _bytes([type_.encode()]),
  })).SerializeToString()


# (split name, client id, serialized protos): one client of one split.
ClientRows = Tuple[str, str, Sequence[bytes]]


def write_sqlite(path: str, splits: Union[Mapping[str, Mapping[str, Sequence[bytes]]],
                                          Iterable[ClientRows]],
                 batch_rows: int = 20000) -> None:
  """Writes {split_name: {client_id: [serialized protos]}} (or an iterable of
  (split, client_id, protos), consumed as it is written) atomically in TFF's schema.

  Rows go in with `executemany` in batches of about `batch_rows` inside one transaction, so a
  generator of 342,477 clients streams to disk without holding the dataset in memory.
  """
  if isinstance(splits, Mapping):
    splits = ((split, cid, protos) for split, clients in splits.items()
              for cid, protos in clients.items())
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix='.tmp')
  os.close(fd)
  try:
    con = sqlite3.connect(tmp)
    try:
      # A crash leaves only the temp file, which is removed: no journal needed while writing.
      con.execute('PRAGMA journal_mode = OFF')
      con.execute('PRAGMA synchronous = OFF')
      # Same DDL as tff.simulation.datasets.sql_client_data_utils.
      con.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
                  'serialized_example_proto BLOB NOT NULL);')
      con.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, '
                  'split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);')
      # SQLite checks for a stop every 10,000 steps of a statement (the index of a full
      # population takes seconds); the loop checks between clients.
      con.set_progress_handler(STOP.is_set, 10000)
      examples, metadata = [], []
      for split, client_id, protos in splits:
        if STOP.is_set():
          raise KeyboardInterrupt
        examples.extend((split, client_id, sqlite3.Binary(p)) for p in protos)
        metadata.append((client_id, split, len(protos)))
        if len(examples) >= batch_rows:
          con.executemany('INSERT INTO examples VALUES (?, ?, ?)', examples)
          con.executemany('INSERT INTO client_metadata VALUES (?, ?, ?)', metadata)
          examples, metadata = [], []
      con.executemany('INSERT INTO examples VALUES (?, ?, ?)', examples)
      con.executemany('INSERT INTO client_metadata VALUES (?, ?, ?)', metadata)
      # Not in TFF's files (which TFF's loader reads unchanged either way): lets a client's
      # rows be found without scanning the table (tasks/sql_client_data.py).
      con.execute('CREATE INDEX examples_split_client ON examples (split_name, client_id);')
      con.commit()
    finally:
      con.close()
    os.chmod(tmp, 0o644)   # mkstemp creates 0600; the cache may be shared.
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    if STOP.is_set():   # Also when SQLite was interrupted (its OperationalError).
      raise KeyboardInterrupt from None
    raise


def write_counts_file(path: str, counts: Mapping[str, int]) -> None:
  """The extracted `stackoverflow.{word,tag}_count` format: "token count" per line."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    for token, count in counts.items():
      f.write(f'{token} {count}\n')


def client_data_to_protos(client_data, to_proto) -> dict[str, list[bytes]]:
  """Serializes a TFF ClientData (e.g. `get_synthetic()`) client by client."""
  return {cid: [to_proto(e) for e in client_data.create_tf_dataset_for_client(cid)
                .as_numpy_iterator()] for cid in client_data.client_ids}


# ---------------------------------------------------------------------------------------------
# EMNIST: per-class smooth templates plus writer style and pixel noise (learnable by the CNN).

def _emnist_templates(rng, num_classes):
  coarse = rng.uniform(0, 1, size=(num_classes, 7, 7))
  return np.clip(np.kron(coarse, np.ones((4, 4))), 0, 1).astype(np.float32)


def write_emnist_cache(cache_dir: str, num_train_clients: int = 20, examples_per_client: int = 30,
                       seed: int = 0, num_test_clients: int | None = None,
                       noise: float = 0.25) -> str:
  """Writes `emnist_all.sqlite` with splits all_* (62 classes) and digits_only_* (10).

  Clients are generated and written one at a time (any population size fits in memory).
  """
  path = os.path.join(cache_dir, emnist_task.DB_NAME)
  write_sqlite(path, _emnist_clients(num_train_clients, examples_per_client, seed,
                                     num_test_clients, noise))
  return path


def _emnist_clients(num_train_clients, examples_per_client, seed, num_test_clients,
                    noise) -> Iterator[ClientRows]:
  rng = np.random.default_rng(seed)
  num_test_clients = num_test_clients or max(2, num_train_clients // 5)
  templates = _emnist_templates(rng, 62)
  for prefix, n_clients in (('train', num_train_clients), ('test', num_test_clients)):
    digits_only = []   # TFF's files list a split's rows together: digits_only_* after all_*.
    for i in range(n_clients):
      cid = f'f{i:04d}_{seed:02d}'
      shift = rng.normal(0, 0.05, size=(28, 28)).astype(np.float32)   # Writer style.
      # About half the examples are digits, as in real EMNIST, so digits_only clients are
      # not tiny.
      labels = np.where(rng.uniform(size=examples_per_client) < 0.5,
                        rng.integers(0, 10, size=examples_per_client),
                        rng.integers(10, 62, size=examples_per_client))
      images = [np.clip(templates[l] + shift + rng.normal(0, noise, (28, 28)), 0, 1)
                for l in labels]
      protos = [emnist_example(img, l) for img, l in zip(images, labels)]
      yield f'all_{prefix}', cid, protos
      digits = [p for p, l in zip(protos, labels) if l < 10]
      if digits:
        digits_only.append((f'digits_only_{prefix}', cid, digits))
    yield from digits_only


# ---------------------------------------------------------------------------------------------
# StackOverflow: Zipfian words with a deterministic successor rule (learnable next word), and
# topic words that determine the tags (learnable tags).

def write_stackoverflow_cache(cache_dir: str, num_train_clients: int = 20,
                              examples_per_client: int = 20, seed: int = 0,
                              num_test_clients: int | None = None,
                              num_heldout_clients: int = 4, vocab_size: int = 10000,
                              num_tags: int = 500, num_topics: int = 20,
                              tokens_per_example: int = 12) -> str:
  """Writes `stackoverflow.sqlite` (train/heldout/test) and the word/tag count files.

  Clients are generated and written one at a time (any population size fits in memory).
  """
  rng = np.random.default_rng(seed)
  num_test_clients = num_test_clients or max(2, num_train_clients // 3)
  words = [f'w{i}' for i in range(vocab_size)]
  zipf = 1.0 / np.arange(1, vocab_size + 1)
  zipf /= zipf.sum()
  successor = rng.permutation(vocab_size)
  # Topic words skip the most frequent Zipf words (when the vocabulary is large enough).
  topic_pool = np.arange(min(50, vocab_size // 5), min(vocab_size, 2000))
  topic_words = [rng.choice(topic_pool, size=min(10, len(topic_pool)), replace=False)
                 for _ in range(num_topics)]
  tag_names = [f't{i}' for i in range(num_tags)]
  word_users = collections.Counter()
  tag_users = collections.Counter()
  sizes = (('train', num_train_clients), ('heldout', num_heldout_clients),
           ('test', num_test_clients))
  # The draws below are numpy's `Generator.choice` spelled out (same random stream, same
  # values; checked byte for byte by tests/test_tasks.py): choice(n, p=zipf) draws one uniform
  # and searches the normalised CDF, choice(a) draws integers(0, len(a)). Spelled out, they
  # skip choice's per-call argument checks and CDF build: ~10x faster, which a 342,477-client
  # population needs.
  zipf_cdf = zipf.cumsum()
  zipf_cdf /= zipf_cdf[-1]
  topic_word_lists = [[int(w) for w in t] for t in topic_words]
  successor_list = [int(w) for w in successor]
  draw_int = rng.integers
  draw = rng.random

  def clients() -> Iterator[ClientRows]:
    for split, n_clients in sizes:
      for i in range(n_clients):
        # As in TFF's StackOverflow, the test split holds later posts of training users (the
        # first test clients are training clients); heldout users are users of their own.
        cid = f'{"tr" if split == "test" else split[:2]}{i:05d}_{seed}'
        client_topics = rng.choice(num_topics, size=2, replace=False)
        protos, used_words, used_tags = [], set(), set()
        for _ in range(examples_per_client):
          topic = int(client_topics[draw_int(0, 2)])
          these_words = topic_word_lists[topic]
          seq = [these_words[draw_int(0, len(these_words))]]
          while len(seq) < tokens_per_example:
            if rng.uniform() < 0.7:
              seq.append(successor_list[seq[-1]])
            elif rng.uniform() < 0.5:
              seq.append(these_words[draw_int(0, len(these_words))])
            else:
              seq.append(int(zipf_cdf.searchsorted(draw(), side='right')))
          tags = [tag_names[topic]] + ([tag_names[num_topics + topic]]
                                       if rng.uniform() < 0.3 and num_tags > 2 * num_topics
                                       else [])
          tokens = ' '.join(words[w] for w in seq)
          title_words = topic_words[topic][draw_int(0, len(these_words), size=3,
                                                    dtype=np.int64)]
          title = ' '.join(words[w] for w in title_words)
          protos.append(stackoverflow_example(tokens=tokens, title=title,
                                              tags='|'.join(tags),
                                              score=int(draw_int(0, 10))))
          used_words.update(seq)
          used_tags.update(tags)
        yield split, cid, protos
        if split == 'train':
          word_users.update(words[w] for w in used_words)
          tag_users.update(used_tags)

  write_sqlite(os.path.join(cache_dir, so_task.DB_NAME), clients())
  # Counts of training users per token, most frequent first (ties by name), as TFF's files;
  # every vocabulary entry is listed so the vocabulary has its full size.
  word_counts = sorted(((w, word_users.get(w, 0)) for w in words), key=lambda x: (-x[1], x[0]))
  tag_counts = sorted(((t, tag_users.get(t, 0)) for t in tag_names), key=lambda x: (-x[1], x[0]))
  datasets = os.path.join(cache_dir, 'datasets')
  write_counts_file(os.path.join(datasets, 'stackoverflow.word_count'), dict(word_counts))
  write_counts_file(os.path.join(datasets, 'stackoverflow.tag_count'), dict(tag_counts))
  return os.path.join(cache_dir, so_task.DB_NAME)


@contextlib.contextmanager
def _exclusive(cache_dir: str):
  """Holds an exclusive lock on `cache_dir` (created if missing) while a cache is checked and
  written: two runs started at once on a fresh checkout (or parallel test workers) would
  otherwise both write the same SQLite file, and one could read a half-written one."""
  os.makedirs(cache_dir, exist_ok=True)
  with open(os.path.join(cache_dir, '.lock'), 'a') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # Released when the file closes.
    yield


def ensure_default_cache(cache_dir: str, task_name: str) -> str:
  """Builds the embedded default dataset for `task_name` in `cache_dir` unless present."""
  if task_name not in registry.TASKS:
    raise UserInputError(f'no embedded dataset for task {task_name!r}')
  family = registry.TASKS[task_name].family
  cache_dir = os.path.expanduser(cache_dir)   # `~` as a user may type it in a path flag.
  marker = os.path.join(cache_dir, _MARKER.format(family))
  db = emnist_task.DB_NAME if family == 'emnist' else so_task.DB_NAME
  if os.path.exists(marker) and os.path.exists(os.path.join(cache_dir, db)):
    return cache_dir
  try:
    return _build_default_cache(cache_dir, family, marker, db)
  except OSError as e:
    raise UserInputError(f'`embedded_data_dir` {cache_dir}: cannot write the embedded dataset '
                         f'there ({e.strerror or e}); point it at a writable directory') from e


def _build_default_cache(cache_dir: str, family: str, marker: str, db: str) -> str:
  with _exclusive(cache_dir):
    if os.path.exists(marker) and os.path.exists(os.path.join(cache_dir, db)):
      return cache_dir   # Another process built it while this one waited.
    if family == 'emnist':
      write_emnist_cache(cache_dir, seed=0, **DEFAULT_SIZES['emnist'])
    else:
      write_stackoverflow_cache(cache_dir, seed=0, **DEFAULT_SIZES['stackoverflow'])
    with open(marker, 'w') as f:
      f.write('generated by tasks.synthetic_data.ensure_default_cache (seed 0)\n')
  return cache_dir


# ---------------------------------------------------------------------------------------------
# Population-sized caches (generated on demand, never in git).

def population_sizes(family: str, population: Union[int, str]) -> dict:
  """Generator arguments for `population` training clients ('full': the real dataset's).

  The other splits keep the real dataset's proportions to the training split (EMNIST: as many
  test writers; StackOverflow: 38,758 heldout and 204,088 test per 342,477 train clients), and
  each client has `FULL_SIZES`' few examples.
  """
  if family not in FULL_SIZES:
    raise UserInputError(f'no generator for dataset family {family!r} '
                         f'(choose {", ".join(FULL_SIZES)})')
  full = dict(FULL_SIZES[family])
  if population == 'full':
    return full
  try:
    n = int(population)
  except (TypeError, ValueError):
    raise UserInputError(f'population must be "full" or a positive integer, got '
                         f'{population!r}') from None
  if n < 1:
    raise UserInputError(f'population must be positive, got {n}')
  scale = n / full['num_train_clients']
  sizes = dict(full, num_train_clients=n)
  for key in ('num_test_clients', 'num_heldout_clients'):
    if key in full:
      sizes[key] = max(2, round(full[key] * scale))
  return sizes


def ensure_population_cache(cache_dir: str, family: str, population: Union[int, str] = 'full',
                            seed: int = 0, log=None) -> str:
  """Generates the `family` cache with `population` training clients in `cache_dir` unless a
  finished one with the same settings is there (a marker file records them); returns
  `cache_dir`."""
  sizes = population_sizes(family, population)
  settings = f'family={family} seed={seed} ' + ' '.join(f'{k}={v}' for k, v in
                                                         sorted(sizes.items()))
  marker = os.path.join(cache_dir, _MARKER.format(family) + '_population')

  def finished():
    if os.path.exists(marker):
      with open(marker) as f:
        return f.read().strip() == settings
    return False

  if finished():
    return cache_dir
  with _exclusive(cache_dir):
    if finished():
      return cache_dir   # Another process built it while this one waited.
    if os.path.exists(marker):
      os.remove(marker)
    start = time.perf_counter()
    if log is not None:
      log(f'generating {family} cache ({settings}) in {cache_dir}')
    if family == 'emnist':
      write_emnist_cache(cache_dir, seed=seed, **sizes)
    else:
      write_stackoverflow_cache(cache_dir, seed=seed, **sizes)
    if log is not None:
      log(f'generated {family} cache ({settings}) in {cache_dir} in '
          f'{time.perf_counter() - start:.1f} s')
    with open(marker, 'w') as f:
      f.write(settings + '\n')
  return cache_dir


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m tasks.synthetic_data',
      description='Generate a synthetic TFF-format cache (read by the real TFF loaders).')
  parser.add_argument('--family', choices=sorted(FULL_SIZES), required=True)
  parser.add_argument('--population', default='full',
                      help='"full" (the real dataset\'s client counts) or a number of '
                      'training clients')
  parser.add_argument('--cache_dir', required=True, help='directory to write the cache to')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  try:
    ensure_population_cache(args.cache_dir, args.family, args.population, args.seed,
                            log=lambda m: print(m, file=sys.stderr))
  except UserInputError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  except KeyboardInterrupt:   # Each file is written to a temporary name, then renamed.
    print(f'interrupted: the files of {args.cache_dir} written so far are complete (a file being '
          'written was removed); rerun the command to finish the cache', file=sys.stderr)
    return 130
  return 0


if __name__ == '__main__':
  from tff_dp import cli_flags  # pylint: disable=g-import-not-at-top
  cli_flags.interruptible()   # Started as a background job too, Ctrl-C stops it.
  signal.signal(signal.SIGINT, _stop)   # And is seen even where its exception is swallowed.
  sys.exit(main())
