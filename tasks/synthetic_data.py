"""Small, seeded, learnable datasets written in TFF's exact on-disk format.

The files are what `tff.simulation.datasets.{emnist,stackoverflow}.load_data(cache_dir=...)`
read after downloading: an SQLite database with tables
`examples(split_name, client_id, serialized_example_proto)` and
`client_metadata(client_id, split_name, num_examples)` (plus an index on
`examples(split_name, client_id)` for per-client reads), whose protos are `tf.train.Example`s
with the same features and dtypes as the real data, under the same split names and file
names. StackOverflow also gets the extracted word/tag count files (see tasks/vocab.py). The real
loaders therefore run unchanged on them; they back the embedded demo dataset and the tests.
"""

import collections
import os
import sqlite3
import tempfile
from typing import Iterable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from tasks import emnist as emnist_task
from tasks import stackoverflow as so_task
from tff_dp.errors import UserInputError

# Embedded default sizes: big enough to learn something in a demo, small enough for seconds.
DEFAULT_SIZES = {
    'emnist': dict(num_train_clients=100, examples_per_client=60, num_test_clients=20),
    'stackoverflow': dict(num_train_clients=60, examples_per_client=40, num_test_clients=20,
                          num_heldout_clients=10),
}
_MARKER = '.tff_dp_embedded_{}'


# ---------------------------------------------------------------------------------------------
# Format: tf.Example protos and the SQLite tables.

def _bytes(values: Sequence[bytes]) -> tf.train.Feature:
  return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _int64(values: Sequence[int]) -> tf.train.Feature:
  return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _float(values: Iterable[float]) -> tf.train.Feature:
  return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


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


def write_sqlite(path: str, splits: Mapping[str, Mapping[str, Sequence[bytes]]]) -> None:
  """Writes {split_name: {client_id: [serialized protos]}} atomically in TFF's schema."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix='.tmp')
  os.close(fd)
  with sqlite3.connect(tmp) as con:
    # Same DDL as tff.simulation.datasets.sql_client_data_utils.
    con.execute('CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT NOT NULL, '
                'serialized_example_proto BLOB NOT NULL);')
    con.execute('CREATE TABLE client_metadata (client_id TEXT NOT NULL, '
                'split_name TEXT NOT NULL, num_examples INTEGER NOT NULL);')
    for split, clients in splits.items():
      for client_id, protos in clients.items():
        con.executemany('INSERT INTO examples VALUES (?, ?, ?)',
                        [(split, client_id, sqlite3.Binary(p)) for p in protos])
        con.execute('INSERT INTO client_metadata VALUES (?, ?, ?)',
                    (client_id, split, len(protos)))
    # Not in TFF's files (which TFF's loader reads unchanged either way): lets a client's rows
    # be found without scanning the table (tasks/sql_client_data.py).
    con.execute('CREATE INDEX examples_split_client ON examples (split_name, client_id);')
  con.close()
  os.chmod(tmp, 0o644)   # mkstemp creates 0600; the cache may be shared.
  os.replace(tmp, path)


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
  """Writes `emnist_all.sqlite` with splits all_* (62 classes) and digits_only_* (10)."""
  rng = np.random.default_rng(seed)
  num_test_clients = num_test_clients or max(2, num_train_clients // 5)
  templates = _emnist_templates(rng, 62)
  splits = collections.defaultdict(dict)
  for prefix, n_clients in (('train', num_train_clients), ('test', num_test_clients)):
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
      splits[f'all_{prefix}'][cid] = protos
      digits = [p for p, l in zip(protos, labels) if l < 10]
      if digits:
        splits[f'digits_only_{prefix}'][cid] = digits
  path = os.path.join(cache_dir, emnist_task.DB_NAME)
  write_sqlite(path, splits)
  return path


# ---------------------------------------------------------------------------------------------
# StackOverflow: Zipfian words with a deterministic successor rule (learnable next word), and
# topic words that determine the tags (learnable tags).

def write_stackoverflow_cache(cache_dir: str, num_train_clients: int = 20,
                              examples_per_client: int = 20, seed: int = 0,
                              num_test_clients: int | None = None,
                              num_heldout_clients: int = 4, vocab_size: int = 10000,
                              num_tags: int = 500, num_topics: int = 20,
                              tokens_per_example: int = 12) -> str:
  """Writes `stackoverflow.sqlite` (train/heldout/test) and the word/tag count files."""
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
  splits = collections.defaultdict(dict)
  sizes = (('train', num_train_clients), ('heldout', num_heldout_clients),
           ('test', num_test_clients))
  for split, n_clients in sizes:
    for i in range(n_clients):
      cid = f'{split[:2]}{i:05d}_{seed}'
      client_topics = rng.choice(num_topics, size=2, replace=False)
      protos, used_words, used_tags = [], set(), set()
      for _ in range(examples_per_client):
        topic = int(rng.choice(client_topics))
        seq = [int(rng.choice(topic_words[topic]))]
        while len(seq) < tokens_per_example:
          if rng.uniform() < 0.7:
            seq.append(int(successor[seq[-1]]))
          elif rng.uniform() < 0.5:
            seq.append(int(rng.choice(topic_words[topic])))
          else:
            seq.append(int(rng.choice(vocab_size, p=zipf)))
        tags = [tag_names[topic]] + ([tag_names[num_topics + topic]]
                                     if rng.uniform() < 0.3 and num_tags > 2 * num_topics
                                     else [])
        tokens = ' '.join(words[w] for w in seq)
        title = ' '.join(words[w] for w in rng.choice(topic_words[topic], size=3))
        protos.append(stackoverflow_example(tokens=tokens, title=title, tags='|'.join(tags),
                                            score=int(rng.integers(0, 10))))
        used_words.update(seq)
        used_tags.update(tags)
      splits[split][cid] = protos
      if split == 'train':
        word_users.update(words[w] for w in used_words)
        tag_users.update(used_tags)
  write_sqlite(os.path.join(cache_dir, so_task.DB_NAME), splits)
  # Counts of training users per token, most frequent first (ties by name), as TFF's files;
  # every vocabulary entry is listed so the vocabulary has its full size.
  word_counts = sorted(((w, word_users.get(w, 0)) for w in words), key=lambda x: (-x[1], x[0]))
  tag_counts = sorted(((t, tag_users.get(t, 0)) for t in tag_names), key=lambda x: (-x[1], x[0]))
  datasets = os.path.join(cache_dir, 'datasets')
  write_counts_file(os.path.join(datasets, 'stackoverflow.word_count'), dict(word_counts))
  write_counts_file(os.path.join(datasets, 'stackoverflow.tag_count'), dict(tag_counts))
  return os.path.join(cache_dir, so_task.DB_NAME)


def ensure_default_cache(cache_dir: str, task_name: str) -> str:
  """Builds the embedded default dataset for `task_name` in `cache_dir` unless present."""
  if task_name not in ('emnist', 'stackoverflow_word', 'stackoverflow_tag'):
    raise UserInputError(f'no embedded dataset for task {task_name!r}')
  family = 'emnist' if task_name == 'emnist' else 'stackoverflow'
  marker = os.path.join(cache_dir, _MARKER.format(family))
  db = emnist_task.DB_NAME if family == 'emnist' else so_task.DB_NAME
  if os.path.exists(marker) and os.path.exists(os.path.join(cache_dir, db)):
    return cache_dir
  os.makedirs(cache_dir, exist_ok=True)
  if family == 'emnist':
    write_emnist_cache(cache_dir, seed=0, **DEFAULT_SIZES['emnist'])
  else:
    write_stackoverflow_cache(cache_dir, seed=0, **DEFAULT_SIZES['stackoverflow'])
  with open(marker, 'w') as f:
    f.write('generated by tasks.synthetic_data.ensure_default_cache (seed 0)\n')
  return cache_dir
