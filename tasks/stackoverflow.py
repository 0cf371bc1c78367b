"""StackOverflow next-word prediction and tag prediction on TFF's loader and preprocessing.

TFF's baseline constructors call `load_word_counts()` without `cache_dir` (so they would
download into ~/.keras); we compose the same pieces with the cache dir passed through.
"""

import os
from typing import Optional

import attrs
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.simulation.baselines import keras_metrics
from tensorflow_federated.python.simulation.baselines.stackoverflow import constants
from tensorflow_federated.python.simulation.baselines.stackoverflow import tag_prediction_preprocessing
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_models
from tensorflow_federated.python.simulation.baselines.stackoverflow import word_prediction_preprocessing

from tasks import data_files
from tasks import sql_client_data
from tasks import vocab as vocab_lib
from tasks.base import FederatedTask
from tff_dp.errors import UserInputError

DB_NAME = data_files.DATABASES['stackoverflow']   # What TFF's stackoverflow.load_data reads.
SPLITS = data_files.STACKOVERFLOW_SPLITS


def _load(data_dir):
  data_files.check_task_data('stackoverflow', data_dir)
  train, _, test = tff.simulation.datasets.stackoverflow.load_data(cache_dir=data_dir)
  # TFF pastes client ids into SQL text; read each client with an exact query instead.
  return sql_client_data.safe_client_data(train), sql_client_data.safe_client_data(test)


def _seeded(client_spec, shuffle_seed, make_preprocess_fn):
  """TFF's train preprocessing, with its shuffle seeded when `shuffle_seed` is given.

  TFF's StackOverflow preprocessing shuffles first (unseeded) and then repeats/takes/maps; we
  do the same shuffle with a seed ourselves and pass a buffer of 1 so TFF skips its own.
  """
  if shuffle_seed is None:
    return make_preprocess_fn(client_spec)
  buffer = client_spec.shuffle_buffer_size or constants.DEFAULT_SHUFFLE_BUFFER_SIZE
  inner = make_preprocess_fn(attrs.evolve(client_spec, shuffle_buffer_size=1))
  if buffer <= 1:
    return inner
  return lambda ds: inner(ds.shuffle(buffer, seed=shuffle_seed))


def _eval_spec(batch_size):
  return tff.simulation.baselines.ClientSpec(num_epochs=1, batch_size=batch_size,
                                             shuffle_buffer_size=1)


def build_word_prediction(data_dir: str, client_spec, *, vocab_size: int = 10000,
                          sequence_length: int = 20, num_out_of_vocab_buckets: int = 1,
                          embedding_size: int = 96, latent_size: int = 670,
                          shuffle_seed: Optional[int] = None) -> FederatedTask:
  """Next-word prediction: Embedding(96) -> LSTM(670) -> Dense(96) -> Dense(vocab + special)."""
  if vocab_size < 1 or sequence_length < 1:
    raise UserInputError('vocab_size and sequence_length must be positive')
  train, test = _load(data_dir)
  word_counts = vocab_lib.load_word_counts(data_dir, vocab_size)
  vocab = list(word_counts)
  special = word_prediction_preprocessing.get_special_tokens(len(vocab),
                                                             num_out_of_vocab_buckets)
  extended_vocab_size = len(vocab) + special.get_number_of_special_tokens()

  def metrics_fn():
    pad, bos, eos, oov = (special.padding, special.beginning_of_sentence,
                          special.end_of_sentence, special.out_of_vocab)
    # The literature's headline accuracy ignores pad, OOV, BOS and EOS predictions' targets.
    return [
        keras_metrics.MaskedCategoricalAccuracy(
            name='accuracy', masked_tokens=[pad, bos, eos] + list(oov)),
        keras_metrics.MaskedCategoricalAccuracy(name='accuracy_with_oov_eos',
                                                masked_tokens=[pad]),
        keras_metrics.NumTokensCounter(name='num_tokens', masked_tokens=[pad]),
    ]

  return FederatedTask(
      name='stackoverflow_word',
      train_data=train,
      traceable_train_data=True,   # sql_client_data reads a traced id.
      test_data=test,
      preprocess_train=_seeded(
          client_spec, shuffle_seed,
          lambda spec: word_prediction_preprocessing.create_preprocess_fn(
              spec, vocab, sequence_length=sequence_length,
              num_out_of_vocab_buckets=num_out_of_vocab_buckets)),
      preprocess_eval=word_prediction_preprocessing.create_preprocess_fn(
          _eval_spec(64), vocab, sequence_length=sequence_length,
          num_out_of_vocab_buckets=num_out_of_vocab_buckets),
      keras_model_fn=lambda: word_prediction_models.create_recurrent_model(
          vocab_size=extended_vocab_size, embedding_size=embedding_size,
          lstm_size=latent_size),
      loss_fn=lambda: tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics_fn=metrics_fn,
      word_counts=word_counts,
      vocab=vocab,
  )


def build_tag_prediction(data_dir: str, client_spec, *, word_vocab_size: int = 10000,
                         tag_vocab_size: int = 500,
                         shuffle_seed: Optional[int] = None) -> FederatedTask:
  """Tag prediction: normalized bag of words -> sigmoid logistic regression over tags."""
  if word_vocab_size < 1 or tag_vocab_size < 1:
    raise UserInputError('word_vocab_size and tag_vocab_size must be positive')
  train, test = _load(data_dir)
  word_counts = vocab_lib.load_word_counts(data_dir, word_vocab_size)
  tag_counts = vocab_lib.load_tag_counts(data_dir, tag_vocab_size)
  word_vocab, tag_vocab = list(word_counts), list(tag_counts)

  def keras_model_fn():
    return tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(len(word_vocab),)),
        tf.keras.layers.Dense(len(tag_vocab), activation='sigmoid'),
    ])

  return FederatedTask(
      name='stackoverflow_tag',
      train_data=train,
      traceable_train_data=True,   # sql_client_data reads a traced id.
      test_data=test,
      preprocess_train=_seeded(
          client_spec, shuffle_seed,
          lambda spec: tag_prediction_preprocessing.create_preprocess_fn(
              spec, word_vocab, tag_vocab)),
      preprocess_eval=tag_prediction_preprocessing.create_preprocess_fn(
          _eval_spec(100), word_vocab, tag_vocab),
      keras_model_fn=keras_model_fn,
      # As TFF's baseline: BinaryCrossentropy with SUM reduction over the batch.
      loss_fn=lambda: tf.keras.losses.BinaryCrossentropy(
          from_logits=False, reduction=tf.keras.losses.Reduction.SUM),
      # 'accuracy' = precision@1: the top-scored tag is one of the true tags.
      metrics_fn=lambda: [tf.keras.metrics.Precision(top_k=1, name='accuracy'),
                          tf.keras.metrics.Recall(top_k=5, name='recall_at_5')],
      word_counts=word_counts,
      tag_counts=tag_counts,
      vocab=word_vocab,
  )
