"""What a run's epsilon covers: which outputs are DP releases, and the run's privacy statement.

The guarantee (user-level (epsilon, delta)-DP under add/remove-one neighbouring, from the
ledger) covers the outputs of the DP mechanism and their post-processing: the model after each
round (checkpoints, evaluation of it and of its EMA / past-k averages on held-out test data), the
clip trajectory and the noised unclipped-fraction estimate of adaptive clipping (they are
computed from noised queries), the ledger and epsilon (functions of the executed mechanism, not
of client data), and the canaries' empirical epsilon estimates (functions of the released models
and of canary directions drawn independently of the data). Everything else a run can show depends
on client data without noise and is a non-private diagnostic: how many clients a round sampled,
which clients were rejected and why, how many updates were zeroed, round timings and the clients'
training loss/accuracy.

`is_covered_column` is the one place that decides this for a metrics column; it is an
allowlist, so a metric added later is treated as a diagnostic until it is listed here.
"""

from typing import Any, Iterable, Mapping, Optional

# Columns (or prefixes) of metrics.csv that are covered by the guarantee.
_COVERED_COLUMNS = ('round', 'trained_from_aggregate')
_COVERED_PREFIXES = ('epsilon_', 'eval_', 'canary_epsilon_')
# Measurement names of the DP aggregators (tff_dp.aggregators) whose values are computed from
# noised queries or from the pre-round (already released) query state.
_COVERED_AGGREGATOR_KEYS = frozenset({
    'privacy_queries', 'clip', 'next_clip', 'unclipped_fraction_estimate', 'dp_query_metrics',
    'scale', 'next_scale', 'tree_aggregation'})

NEIGHBORING_RELATION = 'add_remove'
# How each relation the accountant uses reads in a statement.
_RELATION_TEXT = {
    'add_remove': 'neighbouring datasets differ in all the data of one client (add/remove-one)',
    'replace_one': 'neighbouring datasets differ in all the data of one client, replaced by '
                   'another client\'s (replace-one)',
    'replace_special': 'neighbouring datasets differ in all the data of one client, replaced '
                       'by a special client that contributes nothing (replace-special, '
                       'Kairouz et al. 2021 Definition 1.1; tree aggregation without sampling)',
}


def is_covered_column(name: str) -> bool:
  """Whether metrics column `name` is covered by the run's DP guarantee."""
  if name in _COVERED_COLUMNS or name.startswith(_COVERED_PREFIXES):
    return True
  parts = name.split('/')
  return parts[0] == 'aggregator' and any(p in _COVERED_AGGREGATOR_KEYS for p in parts[1:])


def released_row(row: Mapping[str, Any], private_release: bool) -> dict[str, Any]:
  """The part of a metrics row a run writes: all of it, or only covered columns."""
  if not private_release:
    return dict(row)
  return {k: v for k, v in row.items() if is_covered_column(k)}


def statement(*, dp: str, rounds_completed: int, epsilons: Mapping[str, Optional[float]],
              delta: Optional[float], sampling_event: Any, sampling_secret: bool,
              private_release: bool, released_columns: Iterable[str],
              neighboring_relation: str = NEIGHBORING_RELATION) -> dict[str, Any]:
  """The run's privacy statement (written to summary.json and printed at the end).

  Args:
    dp: the DP aggregation kind ('none' for no DP).
    rounds_completed: rounds executed and recorded in the ledger.
    epsilons: final epsilon per accountant ('rdp', 'pld') at `delta`.
    delta: the delta of the guarantee.
    sampling_event: the sampler's `ledger.SamplingEvent` (kind, population, q or m).
    sampling_secret: whether the samples came from secret OS randomness (no sampling seed).
    private_release: whether non-private diagnostics were kept out of every output.
    released_columns: metrics columns the run wrote (to list the diagnostics among them).
    neighboring_relation: the relation the accountant used (tff_dp.accounting).
  """
  diagnostics = sorted(c for c in set(released_columns) if not is_covered_column(c))
  if dp == 'none':
    return {'differential_privacy': False,
            'guarantee': 'none: the run trained without differential privacy',
            'rounds': rounds_completed}
  sampling = {'kind': sampling_event.kind, 'population': sampling_event.population_size,
              'secret': sampling_secret}
  if sampling_event.kind == 'poisson':
    sampling['probability'] = sampling_event.probability
    sampling['accounted_as'] = 'Poisson subsampling with this probability (exact)'
  elif sampling_event.kind == 'shuffled':
    sampling['sample_size'] = sampling_event.sample_size
    sampling['accounted_as'] = (
        'each epoch a secret permutation of the population, taken in consecutive blocks: '
        'every client at most once per epoch and per noise tree, no amplification by sampling '
        '(tree aggregation, one SingleEpochTreeAggregationDpEvent per epoch)')
  else:
    sampling['sample_size'] = sampling_event.sample_size
    sampling['accounted_as'] = (
        'Poisson subsampling with q = sample_size / population under add/remove (the usual '
        'DP-FedAvg approximation, not a proven bound for sampling without replacement)')
  if not sampling_secret:
    sampling['note'] = ('a sampling seed was given: whoever holds it knows every round\'s '
                        'sample, and the amplification by sampling does not hold against them')
  return {
      'differential_privacy': True,
      'guarantee': (f'user-level (epsilon, delta)-DP with epsilon = {_fmt(epsilons)} at delta = '
                    f'{delta:g}: {_RELATION_TEXT[neighboring_relation]}'),
      'unit': 'user (client): all of one client\'s examples in every round',
      'neighboring_relation': neighboring_relation,
      'delta': delta,
      'epsilon': dict(epsilons),
      'rounds': rounds_completed,
      'mechanism': (f'DP-FTRL ({dp}: tree-aggregation noise), as recorded in ledger.jsonl'
                    if sampling_event.kind == 'shuffled' else
                    f'DP-FedAvg ({dp} clipping, Gaussian noise), as recorded in ledger.jsonl'),
      'sampling': sampling,
      'covers': [
          'the model after every round (checkpoints/) and anything computed from it alone: '
          'eval_* metrics on held-out test data, EMA / past-k models, uncertainty.json',
          'the clip norms, clip scales and noised unclipped-fraction estimates of adaptive '
          'clipping (aggregator/* columns of those names)',
          'ledger.jsonl and epsilon_* (functions of the executed mechanism only)',
          'canary_epsilon_* (empirical estimates from the released models and the secret '
          'canary directions, which are independent of the data)'],
      'private_release': private_release,
      'non_private_diagnostics': (
          [] if private_release else
          diagnostics + ['console lines naming rejected clients',
                         'tensorboard/ scalars of the columns above']),
      'note': ('non-private diagnostics depend on client data without noise; publish a run '
               'as it is only if it ran with private_release' if not private_release else
               'no non-private diagnostic was written or printed'),
  }


def empirical_estimate(num_canaries: int, num_unseen: int,
                       estimates: Mapping[str, Any]) -> dict[str, Any]:
  """The statement's `empirical_estimate` entry: the canaries' estimates (name ->
  `canaries.CanaryEstimate`) beside the proven epsilon, and what they are."""
  return {
      'canaries': num_canaries,
      'unseen_canaries': num_unseen,
      'method': 'one-shot empirical privacy estimation (Andrew et al., ICLR 2024): canary '
                'clients with secret random directions, Gaussian fits of their cosines with '
                'the model change (final model) or the per-round changes (all iterates)',
      'note': 'a point estimate of what an adversary in each threat model achieves at the '
              'run\'s delta, not an upper bound: the proven bound is `epsilon`',
      'estimates': {name: {'epsilon': e.epsilon, 'mu': e.mu, 'sigma': e.sigma,
                           'null_mu': e.null_mu, 'null_sigma': e.null_sigma}
                    for name, e in estimates.items()},
  }


def _fmt(epsilons: Mapping[str, Optional[float]]) -> str:
  values = [f'{eps:.4g} ({method.upper()})' if eps is not None else
            f'n/a ({method.upper()})' for method, eps in epsilons.items()]
  if all(eps is None for eps in epsilons.values()):
    values = []
  return ' / '.join(values) if values else 'n/a'


def format_statement(s: Mapping[str, Any]) -> str:
  """The statement as a few console lines."""
  if not s.get('differential_privacy'):
    return f'privacy: {s["guarantee"]}'
  sampling = s['sampling']
  rate = (f'q = {sampling["probability"]:.4g}' if 'probability' in sampling
          else f'm = {sampling["sample_size"]}')
  lines = [f'privacy: {s["guarantee"]}, after {s["rounds"]} rounds',
           f'  sampling: {sampling["kind"]}, {rate} of {sampling["population"]} clients, '
           + ('secret (OS randomness)' if sampling['secret'] else
              'NOT secret (sampling seed given)'),
           '  covers: the model and checkpoints, eval metrics, clip trajectory, ledger and '
           'epsilon']
  estimate = s.get('empirical_estimate')
  if estimate:
    found = ', '.join(f'{name.replace("_", " ")} {value["epsilon"]:.4g}'
                      for name, value in estimate['estimates'].items())
    lines.append(f'  empirical epsilon at delta = {s["delta"]:g} from {estimate["canaries"]} '
                 f'canaries (an estimate, not a bound): {found or "n/a"}')
  if s['private_release']:
    lines.append('  private release: no non-private diagnostic was written or printed')
  else:
    lines.append('  not covered (non-private diagnostics): '
                 + ', '.join(s['non_private_diagnostics']))
  return '\n'.join(lines)
