"""The lists of allowed values, one home each: name -> what it means.

Flags, config validation (`tff_dp.training.config`) and the tables that implement each choice
all derive from these dicts (the `dp` setting's choices are the registered mechanisms,
`tff_dp.mechanisms`; `client_sampling`'s the registered samplers, `tff_dp.sampling`). An
implementation table checks at import, with `check_implemented`, that it covers exactly its
list, so a new choice is one entry here plus its implementation; a name listed here and not
implemented (or the reverse) fails at import, not in the middle of a run.

Pure Python: the configuration and the command line's flag parsing import it without
TensorFlow.
"""

import collections.abc
from typing import Callable, Collection, Iterable, Iterator, Mapping


class LiveChoices(collections.abc.Mapping):
  """A setting's choices kept by a registry, name -> meaning: a live view, so a choice
  registered after this view was made is a choice too (flags, config checks and help texts
  built later see it). `names()`: the registry's names, in order; `meaning(name)`: what it
  means (KeyError for another name)."""

  def __init__(self, names: Callable[[], Iterable[str]], meaning: Callable[[str], str]):
    self._names, self._meaning = names, meaning

  def __getitem__(self, name: str) -> str:
    if name not in self._names():
      raise KeyError(name)
    return self._meaning(name)

  def __iter__(self) -> Iterator[str]:
    return iter(list(self._names()))

  def __len__(self) -> int:
    return sum(1 for _ in self._names())

# `eval_data`: what central evaluation runs on, and so whether its metrics are covered by the
# DP guarantee (`tff_dp.run_format.release`).
EVAL_DATA = {
    'test': 'the task\'s test split; covered only if none of its clients is in the training '
            'population (TFF\'s EMNIST and StackOverflow test splits hold the training users: '
            'then evaluation is a non-private diagnostic)',
    'holdout': '`eval_holdout_clients` of the training clients that have test data, chosen '
               'with a secret key and removed from the training population; their test-split '
               'data is evaluated (covered)',
    'public_test': 'the task\'s test split, declared public by the operator (covered by that '
                   'declaration, which the privacy statement records)',
}


# `weighting`: client weights in the average.
WEIGHTINGS = {
    'uniform': 'each client counts the same (what DP requires)',
    'num_examples': 'by example count (non-DP only)',
}

# `client_optimizer`, `server_optimizer` (`tff_dp.training.builders.optimizers`).
OPTIMIZERS = {
    'sgd': 'SGD (with `server_momentum` on the server)',
    'adam': 'Adam',
    'adagrad': 'Adagrad',
    'rmsprop': 'RMSProp',
    'yogi': 'Yogi',
}

# `clip_update_rule` of adaptive clipping (`tff_dp.aggregators.quantile_clipping`).
CLIP_UPDATE_RULES = {
    'geometric': 'C * exp(-eta * (b - gamma))',
    'linear': 'C - eta * (b - gamma)',
}

# `noise_allocation` across clip groups (`tff_dp.noise_budget`).
NOISE_ALLOCATIONS = {
    'proportional': 'every group gets the same noise multiplier',
    'dimensionality': 'groups get noise in proportion to their dimension',
}

# `accounting`: accountants that report epsilon (`tff_dp.accounting`).
ACCOUNTANTS = {
    'rdp': 'Renyi DP, every round',
    'pld': 'privacy loss distributions, every `pld_every` rounds and at the end',
}

# `precondition`: where AdaDPS applies its preconditioner.
PRECONDITION_SIDES = {
    'none': 'no AdaDPS',
    'client': 'precondition the local SGD steps',
    'server': 'precondition each update before clipping',
}

# `preconditioner`: which AdaDPS preconditioner the side information builds.
PRECONDITIONERS = {
    'auto': 'frequency for word/tag counts, second_moment for public_clients, direct for a '
            'scales file',
    'frequency': 'capped max(freq) / freq',
    'rank': 'the `precondition_num_frequent` most frequent tokens keep scale 1, all others '
            'get `precondition_rare_scale`',
    'second_moment': '1 / sqrt(v + eps)',
    'direct': 'the side information is the scales',
}

# `side_info`: AdaDPS side information. 'file:PATH' stands for any file name after 'file:'.
SIDE_INFO = {
    'word_freq': 'public StackOverflow word counts',
    'tag_freq': 'public StackOverflow tag counts',
    'public_clients': 'second moments on `num_public_clients` held-out clients',
    'file:PATH': 'a .npy/.npz file',
}
# The `side_info` choices read from a task's public token counts (a task declares which it has).
TOKEN_SIDE_INFO = ('word_freq', 'tag_freq')

# `train_on_aggregate` (`tff_dp.checkpoint_aggregation`).
TRAIN_ON_AGGREGATE = {
    'none': 'each round starts from the last iterate',
    'ema': 'each round starts from the EMA of server models',
    'past_k': 'each round starts from the average of the last `past_k` server models',
}

# `loop_implementation`: how TFF runs a client's pass over its batches (same steps, same model).
LOOP_IMPLEMENTATIONS = {
    'dataset_iterator': 'a loop over the dataset\'s iterator (the fastest on CPU)',
    'dataset_reduce': 'one DatasetReduce op (TFF\'s default, needed on TPUs)',
}


# `canary_inclusion`: which canaries go into the population (`tff_dp.canaries`).
CANARY_INCLUSIONS = {
    'fixed': '`num_canaries` inserted and `num_unseen_canaries` held out (the one-shot '
             'estimate of Andrew et al. 2024); lower bounds from Clopper-Pearson only',
    'coin': 'each of the `num_canaries` + `num_unseen_canaries` canaries inserted '
            'independently with probability 1/2 by the secret key, as the one-run lower bound '
            'of Steinke, Nasr & Jagielski 2023 requires',
}


def one_of(choices: Collection[str]) -> str:
  """'a, b or c': the choices as a message lists them."""
  names = list(choices)
  return names[0] if len(names) == 1 else f'{", ".join(names[:-1])} or {names[-1]}'


def describe(choices: Mapping[str, str]) -> str:
  """'a: meaning; b: meaning': the choices with their meanings, for help texts."""
  return '; '.join(f'{name}: {meaning}' for name, meaning in choices.items())


def check_implemented(choices: Collection[str], implemented: Collection[str],
                      what: str) -> None:
  """Raises at import when an implementation table does not cover exactly `choices`."""
  if set(choices) != set(implemented):
    raise AssertionError(
        f'{what}: implemented {sorted(implemented)}, listed in tff_dp.choices '
        f'{sorted(choices)}; add or remove the choice in both places')
