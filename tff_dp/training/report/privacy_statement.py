"""A run's privacy statement (summary.json and the console's last lines): the guarantee, with the
epsilon a proof supports as its headline, and what it covers, derived from the one
classification of outputs (`tff_dp.run_format.release`).

Headlines:
  * Poisson sampling: the accountant's epsilon (exact), under add/remove-one when the rate q
    was given before the data was seen, under zero-out when it was derived from the
    population (the claim table's `rate`).
  * fixed_size sampling: the proven without-replacement bound under replace-one
    (`accounting.guarantee.fixed_size_proven`); the Poisson approximation under add/remove
    (what the epsilon_* columns hold) is shown on the same line, labelled as one.
  * A sampling seed: whoever holds it knows every sample, so the headline of a claim that uses
    amplification by sampling (Poisson, fixed-size, cyclic Poisson) is the epsilon without it
    (`accounting.guarantee.without_amplification`); the amplified epsilon holds only while the
    seed stays secret, and is labelled so.
  * Tree aggregation (DP-FTRL, shuffled) and correlated noise under min separation: the
    zero-out epsilon (no amplification is used, so a seed changes nothing).
The relation and the theorem come from the claim table (`accounting.claims`), never from the
caller.
"""

from typing import Any, Iterable, Mapping, Optional

from tff_dp import measurements
from tff_dp import mechanisms
from tff_dp import sampling as sampling_lib
from tff_dp.accounting import guarantee as guarantee_lib
from tff_dp.run_format import columns
from tff_dp.run_format import release

NEIGHBORING_RELATION = 'add_remove'
# How each relation the accountant uses reads in a statement.
_RELATION_TEXT = {
    'add_remove': 'neighbouring datasets differ in all the data of one client (add/remove-one)',
    'replace_one': 'neighbouring datasets differ in all the data of one client, replaced by '
                   'another client\'s (replace-one)',
    'replace_special': 'neighbouring datasets differ in all the data of one client, replaced '
                       'by a special client that contributes nothing, the population unchanged '
                       '(zero-out, i.e. replace-special: Kairouz et al. 2021 Definition 1.1)',
}
# What the statement says of the population size N that the ledger, summary and config record.
_POPULATION_TEXT = (
    'the population size N (and so the sampling rate) is recorded in ledger.jsonl, summary.json '
    'and config.json and is treated as public: the guarantee protects each client\'s data and '
    'participation, not the number of clients')
_EVAL_TEXT = {
    'test_disjoint': 'the task\'s test split, whose clients are not in the training population',
    'test_shared': 'the task\'s test split, which holds clients of the training population: '
                   'evaluation is computed on protected users\' own data without noise (a '
                   'non-private diagnostic; evaluate with eval_data=holdout for a covered one)',
    'public_test': 'the task\'s test split, declared public by the operator (eval_data='
                   'public_test): covered by that declaration, not by the DP guarantee',
    'holdout': 'held-out clients (chosen with a secret key, removed from the training '
               'population): the training population is protected from evaluation, but the '
               'held-out clients\' own data is evaluated without noise, so they are outside '
               'the guarantee (see `outside_guarantee`)',
}


def statement(*, dp: str, rounds_completed: int, epsilons: Mapping[str, Optional[float]],
              delta: Optional[float], sampling_event: Any, facts: release.RunFacts,
              released_columns: Iterable[str], eval_data: str = 'test_shared',
              neighboring_relation: str = NEIGHBORING_RELATION,
              headline: Optional[guarantee_lib.Headline] = None,
              side_information: Optional[str] = None,
              files: Optional[Iterable[str]] = None,
              projection: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
  """The run's privacy statement (written to summary.json and printed at the end).

  Args:
    dp: the DP aggregation kind ('none' for no DP).
    rounds_completed: rounds executed and recorded in the ledger.
    epsilons: final epsilon per accountant ('rdp', 'pld') at `delta`, as the run's accountant
      (and its epsilon_* columns) computed it under `neighboring_relation`.
    delta: the delta of the guarantee.
    sampling_event: the sampler's `ledger.SamplingEvent` (kind, population, q or m, seeded).
    facts: what the run's classification of outputs depends on.
    released_columns: metrics columns the run wrote (to list the diagnostics among them).
    eval_data: which of `_EVAL_TEXT` describes the evaluation data.
    neighboring_relation: the relation the accountant used (tff_dp.accounting).
    headline: what the statement leads with (`accounting.guarantee.headline`: the proven
      fixed-size bound, the epsilon against a seed holder); None: `epsilons` under the claim's
      relation.
    side_information: where AdaDPS side information came from, if used.
    projection: a noise-cohort simulation's projected production run
      (`privacy_recorder.Projection.statement`), stated beside the run's own guarantee.
    files: the run directory's files (relative paths): the statement lists only outputs among
      them (None: every output a run can write).
  """
  files = None if files is None else list(files)
  if dp == 'none':
    return {'differential_privacy': False,
            'guarantee': 'none: the run trained without differential privacy',
            'rounds': rounds_completed}
  claim = mechanisms.claim(dp, sampling_event.kind, sampling_event.probability_given)
  seeded = sampling_event.seeded and claim.amplified
  if headline is None:
    headline = guarantee_lib.Headline(dict(epsilons), claim.relation)
  result, guarantee = _headline(headline, delta)
  relation = headline.relation
  result.update({
      'differential_privacy': True,
      'guarantee': guarantee,
      'unit': 'user (client): all of one client\'s examples in every round',
      'neighboring_relation': relation,
      'proof': claim.proof,
      'population_size': _POPULATION_TEXT,
      'delta': delta,
      'epsilon': dict(headline.epsilon),
      'epsilon_columns': (f'the epsilon_* columns of metrics.csv are the accountant\'s '
                          f'per-round epsilon under {neighboring_relation}'
                          + (' (the Poisson approximation)'
                             if headline.poisson_approximation is not None else '')
                          + (' with amplification by sampling' if seeded else '')),
      'rounds': rounds_completed,
      'mechanism': mechanisms.get(dp).noise.statement.format(dp=dp),
      'sampling': _sampling(sampling_event),
      'evaluation': _EVAL_TEXT[eval_data],
      **_outputs(facts, released_columns, files),
  })
  if eval_data in ('holdout', 'test_disjoint'):
    result['outside_guarantee'] = (
        'the evaluation clients: their own data is evaluated exactly and released as the '
        'evaluation metrics; they are not in the training population, so the guarantee, which '
        'is about the training population, does not cover them')
  if side_information:
    result['side_information'] = side_information
  if projection is not None:
    result['simulation'] = _simulation(projection)
  return result


def _outputs(facts: release.RunFacts, released_columns: Iterable[str],
             files: Optional[list]) -> dict[str, Any]:
  """The statement's entries of what the run wrote: what the guarantee covers, the secrets, the
  non-private diagnostics, the aggregator's measurements, and what to publish."""
  return {
      'covers': release.outputs_of_class(release.COVERED, facts, files),
      'secrets': release.outputs_of_class(release.SECRET, facts, files),
      'private_release': facts.private_release,
      'non_private_diagnostics': _diagnostics(facts, released_columns, files),
      'aggregator_measurements': _aggregator_measurements(facts),
      'note': ('publish the release/ folder as it is; keep everything under secret/ (and '
               'config.json if it holds a sampling seed) to yourself'
               if facts.private_release else
               'non-private diagnostics depend on client data without noise: publish only '
               'what `covers` lists, or run with private_release to get a release/ folder '
               'to publish as it is'),
  }


def _headline(headline: guarantee_lib.Headline, delta) -> tuple[dict, str]:
  """(the statement's entries of the numbers the headline replaced, the guarantee line): the
  headline leads and the numbers it replaced follow, labelled."""
  labelled, result = [], {}
  if headline.poisson_approximation is not None:
    result['epsilon_poisson_approximation'] = dict(headline.poisson_approximation)
    labelled.append(f'Poisson approximation under add/remove, not a proven bound: '
                    f'{_fmt(headline.poisson_approximation)}')
  against = ''
  if headline.if_seed_secret is not None:
    result['epsilon_if_seed_secret'] = dict(headline.if_seed_secret)
    labelled.insert(0, f'{_fmt(headline.if_seed_secret)} if the sampling seed stays secret '
                       '(amplified by sampling)')
    against = ' against anyone who holds the sampling seed (no amplification by sampling)'
  guarantee = (f'user-level (epsilon, delta)-DP with epsilon = {_fmt(headline.epsilon)} at '
               f'delta = {delta:g}{against}: {_RELATION_TEXT[headline.relation]}')
  if labelled:
    guarantee += '; ' + '; '.join(labelled)
  return result, guarantee


def _simulation(projection: Mapping[str, Any]) -> dict[str, Any]:
  """The noise-cohort part of the statement: the projection, and what it is not."""
  return dict(projection, note=(
      'this run is a simulation: it trained {trained_clients_per_round} clients per round '
      'with the noise of {noise_cohort_size} (every query\'s noise scaled by '
      '{noise_scale:.4g}). Its own clients are protected only at the guarantee above. '
      'projected_epsilon is what a production run of {noise_cohort_size} clients per round '
      'from {noise_population}, with the same noise per client and the same rounds and '
      'mechanism, would have at delta {delta:g}: a projection, not a guarantee for anyone '
      'this run trained on').format(**projection))


def _sampling(event) -> dict[str, Any]:
  sampling = {'kind': event.kind, 'population': event.population_size,
              'secret': not event.seeded}
  sampling.update(sampling_lib.get(event.kind).statement(event))
  if sampling_lib.get(event.kind).with_rate:
    sampling['rate'] = (
        'given (sampling_probability): fixed before the data was seen, the same whatever the '
        'population, so a neighbour with one client more or fewer runs with the same q'
        if event.probability_given else
        'derived from the population (clients_per_round / N): a neighbour with one client '
        'more or fewer would run with another q, so the claim is zero-out, whose neighbours '
        'share the population; give sampling_probability for add/remove-one')
  if event.seeded:
    sampling['note'] = ('a sampling seed was given: whoever holds it knows every round\'s '
                        'sample, and the amplification by sampling does not hold against them')
  return sampling


def _aggregator_measurements(facts: release.RunFacts) -> dict[str, str]:
  """Each `aggregator/<key>` column family: whether it is covered, and what it holds, as the
  factory that reports it declares it."""
  return {f'{columns.AGGREGATOR}/{m.key}':
          f'{"covered" if m.covered else "non-private diagnostic"}: {m.meaning}'
          for m in measurements.flattened(facts.measurements)}


def _diagnostics(facts: release.RunFacts, released_columns: Iterable[str],
                 run_files: Optional[list]) -> list[str]:
  columns = sorted(c for c in set(released_columns)
                   if release.classify_column(c, facts) != release.COVERED)
  files = release.outputs_of_class(release.DIAGNOSTIC, facts, run_files)
  if facts.private_release:
    return files   # No diagnostic column was written, nothing printed.
  return columns + files + ['console lines naming rejected clients, and round timings']


def empirical_estimate(num_canaries: int, num_unseen: int, estimates: Mapping[str, Any],
                       min_canaries: int = 0) -> dict[str, Any]:
  """The statement's `empirical_estimate` entry: the canaries' estimates (name ->
  (`canaries.CanaryEstimate`, `canaries.EstimateInterval` or None)) beside the proven
  epsilon, and what they are; none (too few canaries: fewer than `min_canaries`) is said so."""
  intervals = [i for _, i in estimates.values() if i is not None]
  return {
      'canaries': num_canaries,
      'unseen_canaries': num_unseen,
      'method': 'one-shot empirical privacy estimation (Andrew et al., ICLR 2024): canary '
                'clients with secret random directions, Gaussian fits of their cosines with '
                'the model change (final model) or the per-round changes (all iterates)',
      'note': 'an estimate of what an adversary in each threat model achieves at the run\'s '
              'delta, with a bootstrap interval over the canaries; not an upper bound: the '
              'proven bound is `epsilon`',
      'confidence': intervals[0].confidence if intervals else None,
      **({} if estimates else {'too_few_canaries': (
          f'no estimate: fewer than {min_canaries} inserted (and, for all iterates, unseen) '
          'canaries, below which a fit of their statistics carries no information')}),
      'estimates': {name: {'epsilon': e.epsilon, 'mu': e.mu, 'sigma': e.sigma,
                           'null_mu': e.null_mu, 'null_sigma': e.null_sigma,
                           'interval': None if i is None else [i.low, i.high],
                           'too_few_canaries': None if i is None else i.too_few_canaries}
                    for name, (e, i) in estimates.items()},
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
  if 'rate' in sampling:
    rate += (' (given)' if sampling['rate'].startswith('given')
             else ' (derived from N: zero-out)')
  lines = [f'privacy: {s["guarantee"]}, after {s["rounds"]} rounds',
           f'  sampling: {sampling["kind"]}, {rate} of {sampling["population"]} clients, '
           + ('secret (OS randomness)' if sampling['secret'] else
              'NOT secret (sampling seed given)'),
           f'  proof: {s["proof"]}; N is treated as public',
           f'  evaluation: {s["evaluation"]}',
           *([f'  SIMULATION: noise of {s["simulation"]["noise_cohort_size"]} clients per '
              f'round; projected epsilon {_fmt(s["simulation"]["projected_epsilon"])} at delta '
              f'{s["simulation"]["delta"]:g} for {s["simulation"]["noise_population"]} '
              'clients (not this run\'s guarantee)'] if 'simulation' in s else []),
           '  covers: ' + ', '.join(c.split(':')[0] for c in s['covers']),
           '  secret (keep it): ' + (', '.join(c.split(':')[0] for c in s['secrets'])
                                     or 'nothing')]
  estimate = s.get('empirical_estimate')
  if estimate:
    lines.append(f'  empirical epsilon at delta = {s["delta"]:g} from {estimate["canaries"]} '
                 f'canaries (an estimate, not a bound): {_format_estimates(estimate)}')
  bounds = s.get('empirical_bounds')
  if bounds:
    found = '; '.join(f'{kind.replace("_", " ")}: ' + ', '.join(
        f'{value:.3g} ({threat.replace("_", " ")})' for threat, value in values.items())
                      for kind, values in bounds['lower_bounds'].items())
    lines.append(f'  canary audit, {bounds["confidence"]:.0%} lower bounds on epsilon at delta '
                 f'= {s["delta"]:g}: {found or "none"}'
                 + (f' ({bounds["no_one_run_bound"]})' if 'no_one_run_bound' in bounds else ''))
  if s['private_release']:
    lines.append('  private release: no non-private diagnostic was printed; publish release/')
  else:
    lines.append('  not covered (non-private diagnostics): '
                 + ', '.join(c.split(':')[0] for c in s['non_private_diagnostics']))
  return '\n'.join(lines)


def _format_estimates(estimate: Mapping[str, Any]) -> str:
  found = []
  for name, value in estimate['estimates'].items():
    text = f'{name.replace("_", " ")} {value["epsilon"]:.4g}'
    if value.get('interval') is not None:
      low, high = value['interval']
      text += f' ({estimate["confidence"]:.0%} interval {low:.3g}-{high:.3g})'
    if value.get('too_few_canaries'):
      text += f' [too few canaries: {value["too_few_canaries"]}]'
    found.append(text)
  return ', '.join(found) or estimate.get('too_few_canaries', 'n/a')
