"""Attack tests of the claim table (`tff_dp.accounting.claims`, docs/PRIVACY.md "Claims").

For every (mechanism, sampler) row, the claimed (epsilon, delta) is what the library's
accountant reports for a small ledger of that row, under the relation the library states for
it. The test then builds the worst-case neighbouring pair that relation allows (every client
sends +1 along one direction at the clip norm; the differing client sends -1 or is zeroed),
runs the library's own samplers on both datasets, and computes the privacy curve of the
released outputs independently of the accountant:

* Rows without amplification (min separation, tree): the release is C x + sigma z with C
  built here from the recorded strategy. Conditioned on the sampler's randomness each
  neighbouring pair is two Gaussians, delta(eps) in closed form; the average over the
  randomness is an upper bound on the true delta (joint convexity of the hockey-stick
  divergence), so a claim that passes is sound.
* Rows with amplification (Poisson, fixed-size): the samplers are checked, draw by draw, to
  change a round's sum only through the differing client, at the claimed rate; the exact
  mixture pair is then composed over rounds by a numpy privacy-loss distribution on a grid
  rounded up (an upper bound again).

Each test fails where the claim is wrong: `test_min_separation_*` against the add/remove claim
the package used to make (an added client shifts every later block), the cyclic-Poisson test
against a partition by rank (an added client moves others between groups).
"""

import math
import re

import numpy as np
import pytest
from scipy import signal
from scipy import stats

from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp import sampling
from tff_dp.accounting import accountant
from tff_dp.accounting import claims
from tff_dp.accounting import correlated

DELTA = 1e-5
CLIP = 1.0


def _gaussian_delta(shift: float, eps: float) -> float:
  """delta(eps) of N(shift, 1) against N(0, 1) (Balle & Wang 2018, Theorem 8)."""
  if shift == 0.0:
    return 0.0
  return float(stats.norm.cdf(-eps / shift + shift / 2)
               - math.exp(eps) * stats.norm.cdf(-eps / shift - shift / 2))


def _claimed(records, relation=None, methods=('rdp', 'pld')):
  """(epsilon RDP, epsilon PLD, relation) the library's accountant reports for `records`, under
  the relation it states for them (`default_relation`, as the accounting CLI) unless given."""
  relation = relation or accountant.default_relation(records)
  acc = accountant.LedgerAccountant(DELTA, methods, neighboring_relation=relation)
  for record in records:
    acc.add(record)
  eps = acc.epsilon(final=True)
  return eps['rdp'], eps.get('pld'), acc.neighboring_relation


def _neighbours(ids, relation):
  """(updates of D, updates of D') for the worst case of `relation`: every client +1; the
  differing client is added with -1 (add/remove), zeroed (zero-out), or replaced by a new
  client with -1 (replace-one)."""
  d = {c: 1.0 for c in ids}
  if relation == 'add_remove':
    return d, dict(d, target=-1.0)
  if relation == claims.ZERO_OUT:
    return d, dict(d, **{ids[0]: 0.0})
  other = {c: 1.0 for c in ids[1:]}
  return d, dict(other, target=-1.0)


def _sums(sampler, updates, rounds):
  return np.array([sum(updates[c] for c in sampler.sample(r)) for r in range(1, rounds + 1)])


def _toeplitz(coefs, n):
  """The lower-triangular Toeplitz matrix of `coefs`, built here."""
  c = np.zeros((n, n))
  for k, value in enumerate(coefs[:n]):
    c += np.diag(np.full(n - k, value), -k)
  return c


def _coefs(noise: ledger_lib.CorrelatedNoise, n: int) -> np.ndarray:
  """The strategy's coefficients from what the ledger records: the banded square root
  binom(2k, k) / 4^k column-normalized, or BLT's 1, sum_i omega_i theta_i^(k-1)."""
  if noise.mechanism == 'bandmf':
    c = np.array([math.comb(2 * k, k) / 4**k for k in range(noise.bands)])
    c = c / np.linalg.norm(c)
    return np.concatenate([c, np.zeros(max(0, n - len(c)))])
  theta, omega = np.array(noise.buf_decay), np.array(noise.output_scale)
  return np.array([1.0] + [float(np.sum(omega * theta**(k - 1))) for k in range(1, n)])


def _conditional_delta(make_sampler, ids, relation, rounds, release, sigma, eps, seeds):
  """Mean over `seeds` of delta(eps) of the Gaussian pair the two datasets give under the
  same sampler randomness: an upper bound on the true delta."""
  d, d_prime = _neighbours(ids, relation)
  deltas = []
  for seed in seeds:
    x = _sums(make_sampler(list(d), seed), d, rounds)
    x_prime = _sums(make_sampler(list(d_prime), seed), d_prime, rounds)
    shift = float(np.linalg.norm(release @ (x_prime - x))) / sigma
    deltas.append(_gaussian_delta(shift, eps))
  return float(np.mean(deltas))


def _correlated_records(mechanism, sampler, rounds, min_separation, participations, z,
                        amplified=False, bands=None):
  found = mechanisms.get(mechanism).strategy(rounds, min_separation, participations,
                                             bands=bands, amplified=amplified)
  noise = correlated.recorded(found, rounds, min_separation, participations)
  sigma = z * CLIP * math.sqrt(found.sensitivity_squared)
  query = (ledger_lib.GaussianSumQuery('update', CLIP, sigma),)
  records = [ledger_lib.RoundRecord(r, sampler.sampling_event(r), query, None, noise)
             for r in range(1, rounds + 1)]
  return records, noise, sigma


IDS = [f'c{i}' for i in range(40)]
ROUNDS = 12


@pytest.mark.parametrize('mechanism', ['blt', 'bandmf'])
def test_min_separation_zero_out(mechanism):
  """blt / bandmf under min separation: 40 clients, 10 a round, every 4 rounds, 12 rounds."""
  sampler = sampling.build_sampler('min_separation', IDS, 10, seed=0)
  records, noise, sigma = _correlated_records(mechanism, sampler, ROUNDS, 4, 3, z=1.0)
  eps_rdp, eps_pld, relation = _claimed(records)
  release = _toeplitz(_coefs(noise, ROUNDS), ROUNDS)
  make = lambda ids, seed: sampling.build_sampler('min_separation', ids, 10, seed=seed)
  for eps in (eps_rdp, eps_pld):
    real = _conditional_delta(make, IDS, relation, ROUNDS, release, sigma, eps, range(60))
    assert real <= DELTA * (1 + 1e-6), (relation, eps, real)
  assert relation == claims.ZERO_OUT


def test_min_separation_add_remove_is_refused_and_would_not_hold():
  """The relation the package used to state for min separation: the attack measures a delta
  far above the claim, and the accountant now refuses to print it."""
  sampler = sampling.build_sampler('min_separation', IDS, 10, seed=0)
  records, noise, sigma = _correlated_records('bandmf', sampler, ROUNDS, 4, 3, z=1.0)
  eps_rdp, eps_pld, _ = _claimed(records)   # The same number the old add/remove claim printed.
  release = _toeplitz(_coefs(noise, ROUNDS), ROUNDS)
  make = lambda ids, seed: sampling.build_sampler('min_separation', ids, 10, seed=seed)
  real = _conditional_delta(make, IDS, 'add_remove', ROUNDS, release, sigma, eps_pld, range(60))
  assert real > 100 * DELTA
  with pytest.raises(Exception, match='proven under replace_special'):
    _claimed(records, 'add_remove')


def test_cyclic_poisson_add_remove():
  """Amplified BandMF at a given q = 1 (40 clients, 4 groups, 10 a round, 3 cycles): an added
  client moves nobody, and the rate is the same for both neighbours, so the pair differs in
  the added client's rounds only."""
  sampler = sampling.build_sampler('cyclic_poisson', IDS, 10, seed=0, groups=4,
                                   probability=1.0)
  records, noise, sigma = _correlated_records('bandmf', sampler, ROUNDS, 4, 1, z=1.5,
                                              amplified=True, bands=4)
  eps_rdp, eps_pld, relation = _claimed(records)
  assert relation == 'add_remove'
  release = _toeplitz(_coefs(noise, ROUNDS), ROUNDS)
  # Each side's sampler as the package builds it for that side's clients, with the given q.
  make = lambda ids, seed: sampling.build_sampler('cyclic_poisson', ids, 10, seed=seed,
                                                  groups=4, probability=1.0)
  for eps in (eps_rdp, eps_pld):
    real = _conditional_delta(make, IDS, relation, ROUNDS, release, sigma, eps, range(60))
    assert real <= DELTA * (1 + 1e-6), (eps, real)


def test_cyclic_poisson_zero_out():
  """Amplified BandMF with q derived from the population (q = 10 x 4 / 40 = 1): the claim the
  package states must hold for neighbours built as that claim's relation allows, each side's
  sampler built by the package for that side's clients. Under add/remove the added client
  would lower q to 40/41 for everyone (delta 0.04 where 1e-5 was claimed); the claim is
  zero-out, whose neighbours share the population and so q."""
  sampler = sampling.build_sampler('cyclic_poisson', IDS, 10, seed=0, groups=4)
  assert sampler.probability == 1.0
  records, noise, sigma = _correlated_records('bandmf', sampler, ROUNDS, 4, 1, z=1.5,
                                              amplified=True, bands=4)
  eps_rdp, eps_pld, relation = _claimed(records)
  release = _toeplitz(_coefs(noise, ROUNDS), ROUNDS)
  make = lambda ids, seed: sampling.build_sampler('cyclic_poisson', ids, 10, seed=seed,
                                                  groups=4)
  for eps in (eps_rdp, eps_pld):
    real = _conditional_delta(make, IDS, relation, ROUNDS, release, sigma, eps, range(60))
    assert real <= DELTA * (1 + 1e-6), (relation, eps, real)
  assert relation == claims.ZERO_OUT and not sampler.probability_given
  with pytest.raises(Exception, match='gives `sampling_probability`'):
    _claimed(records, 'add_remove')


def _tree_release(rounds_per_epoch: int, epochs: int) -> np.ndarray:
  """Tree aggregation restarted every epoch as a matrix: one row per node of each epoch's
  binary tree that a prefix sum of the epoch uses (a dyadic interval inside the epoch)."""
  rows = []
  for e in range(epochs):
    for level in range(int(math.log2(rounds_per_epoch)) + 1):
      size = 2**level
      for start in range(0, rounds_per_epoch - size + 1, size):
        row = np.zeros(rounds_per_epoch * epochs)
        row[e * rounds_per_epoch + start:e * rounds_per_epoch + start + size] = 1.0
        rows.append(row)
  return np.array(rows)


def test_tree_shuffled_zero_out():
  """DP-FTRL: 40 clients, 10 a round, 4-round epochs (each client once), 3 epochs."""
  sampler = sampling.build_sampler('shuffled', IDS, 10, seed=0)
  sigma = 2.0
  query = (ledger_lib.GaussianSumQuery('update', CLIP, sigma),)
  records = [ledger_lib.RoundRecord(r, sampler.sampling_event(r), query,
                                    (r - 1) % 4 + 1) for r in range(1, ROUNDS + 1)]
  eps_rdp, eps_pld, relation = _claimed(records)
  assert relation == claims.ZERO_OUT and eps_pld is None   # RDP only for the tree.
  make = lambda ids, seed: sampling.build_sampler('shuffled', ids, 10, seed=seed)
  real = _conditional_delta(make, IDS, relation, ROUNDS, _tree_release(4, 3), sigma, eps_rdp,
                            range(60))
  assert real <= DELTA, real


def _per_round_differences(make_sampler, ids, relation, rounds, seeds):
  """How a round's sum moves between the neighbours under the same seeded draws."""
  d, d_prime = _neighbours(ids, relation)
  return np.concatenate([
      _sums(make_sampler(list(d_prime), s), d_prime, rounds)
      - _sums(make_sampler(list(d), s), d, rounds) for s in seeds])


def _loss_delta(log_a, log_b, weight, rounds, eps, grid):
  """delta(eps) of `rounds` compositions of densities a against b (log densities on a grid
  with quadrature `weight`): the privacy loss log a - log b rounded up to `grid` (an upper
  bound), its distribution under a convolved over the rounds."""
  loss = log_a - log_b
  index = np.ceil((loss - loss.min()) / grid).astype(int)
  pmf = np.bincount(index, weights=np.exp(log_a) * weight)
  total, offset = pmf, loss.min()
  for _ in range(rounds - 1):
    total = signal.fftconvolve(total, pmf)
  values = rounds * offset + grid * np.arange(len(total))
  return float(np.sum(total * np.clip(-np.expm1(eps - values), 0, None)))


def _mixture_delta(q: float, shift: float, rounds: int, eps: float, grid: float = 1e-4):
  """delta(eps) of `rounds` compositions of the pair ((1 - q) N(0, 1) + q N(shift, 1),
  N(0, 1)), in both orders, by a numpy privacy-loss distribution (`_loss_delta`)."""
  y = np.linspace(-12 - abs(shift), 12 + abs(shift), 400001)
  weight = np.gradient(y)
  log_q = stats.norm.logpdf(y)
  log_p = np.logaddexp(np.log1p(-q) + log_q, np.log(q) + stats.norm.logpdf(y - shift))
  return max(_loss_delta(log_p, log_q, weight, rounds, eps, grid),
             _loss_delta(log_q, log_p, weight, rounds, eps, grid))


def _sum_distribution(updates, q):
  """{sum: probability} of a round's sum when each client (update +1, 0 or -1) is included
  independently at rate q: the distribution the Poisson sampler draws."""
  dist = {0.0: 1.0}
  for u in updates.values():
    nxt = {}
    for total, p in dist.items():
      nxt[total] = nxt.get(total, 0.0) + p * (1 - q)
      nxt[total + u] = nxt.get(total + u, 0.0) + p * q
    dist = {k: v for k, v in nxt.items() if v > 1e-40}   # The rest: < 1e-38 in all.
  return dist


def _sums_delta(p, q, sigma, rounds, eps, grid=1e-4):
  """delta(eps) of `rounds` compositions of the pair of Gaussian mixtures sum_k p[k] N(k,
  sigma^2) and sum_k q[k] N(k, sigma^2), in both orders (`_loss_delta`)."""
  means = [k / sigma for k in (*p, *q)]
  y = np.linspace(min(means) - 12, max(means) + 12, 400001)
  weight = np.gradient(y)

  def log_density(mixture):
    return np.logaddexp.reduce([math.log(w) + stats.norm.logpdf(y - k / sigma)
                                for k, w in mixture.items()], axis=0)

  log_p, log_q = log_density(p), log_density(q)
  return max(_loss_delta(log_p, log_q, weight, rounds, eps, grid),
             _loss_delta(log_q, log_p, weight, rounds, eps, grid))


def test_poisson_add_remove():
  """DP-FedAvg, Poisson at a given q = 0.2 over 60 clients, z = 1, 3 rounds."""
  ids, q, z, rounds = IDS[:30] + [f'd{i}' for i in range(30)], 0.2, 1.0, 3
  sampler = sampling.build_sampler('poisson', ids, 12, seed=0, probability=q)
  query = (ledger_lib.GaussianSumQuery('update', CLIP, z * CLIP),)
  records = [ledger_lib.RoundRecord(r, sampler.sampling_event(r), query)
             for r in range(1, rounds + 1)]
  eps_rdp, eps_pld, relation = _claimed(records)
  assert relation == 'add_remove'
  # Each side's sampler as the package builds it for that side's clients, with the given q.
  moves = _per_round_differences(
      lambda i, s: sampling.build_sampler('poisson', i, 12, seed=s, probability=q), ids,
      relation, 1, range(3000))
  assert set(moves) <= {0.0, -1.0}   # Only the added client's own -1 ever moves a sum.
  assert abs(np.mean(moves == -1.0) - q) < 5 * math.sqrt(q * (1 - q) / moves.size)
  for eps in (eps_rdp, eps_pld):
    assert _mixture_delta(q, -CLIP / (z * CLIP), rounds, eps) <= DELTA * 1.001, eps


@pytest.mark.parametrize('population, clients_per_round, z, rounds, seed', [
    (40, 40, 2.0, 3, None),   # q = m / N = 1: an added client lowers everyone's q.
    (40, 38, 1.0, 10, 7),     # Seeded, q = 38/40 against 38/41.
])
def test_poisson_zero_out(population, clients_per_round, z, rounds, seed):
  """DP-FedAvg with q derived from the population (q = clients_per_round / N). The claim the
  package states is attacked with the neighbours its relation allows, each side's rate the
  one the package's sampler takes for that side's clients, and the exact mixture of each
  round's sum (every client included at that rate) composed over the rounds. The add/remove
  claim the package used to make fails here (delta 0.054 and 1.1e-4 where 1e-5 was claimed:
  the added client changes q for all); the zero-out claim holds."""
  ids = [f'c{i}' for i in range(population)]
  sampler = sampling.build_sampler('poisson', ids, clients_per_round, seed=seed)
  query = (ledger_lib.GaussianSumQuery('update', CLIP, z * CLIP),)
  records = [ledger_lib.RoundRecord(r, sampler.sampling_event(r), query)
             for r in range(1, rounds + 1)]
  eps_rdp, eps_pld, relation = _claimed(records)
  d, d_prime = _neighbours(ids, relation)
  rate = lambda side: sampling.build_sampler('poisson', list(side), clients_per_round,
                                             seed=seed).probability
  p, q = _sum_distribution(d, rate(d)), _sum_distribution(d_prime, rate(d_prime))
  for eps in (eps_rdp, eps_pld):
    real = _sums_delta(p, q, z * CLIP, rounds, eps)
    assert real <= DELTA * 1.001, (relation, eps, real)
  assert relation == claims.ZERO_OUT
  with pytest.raises(Exception, match='gives `sampling_probability`'):
    _claimed(records, 'add_remove')


def test_fixed_size_replace_one():
  """Fixed-size samples of 10 from 50 (q = 0.2), z = 1.5, 3 rounds: the proven claim is the
  without-replacement bound under replace-one (its epsilon_* columns are the labelled Poisson
  approximation under add/remove)."""
  ids, m, z, rounds = [f'c{i}' for i in range(50)], 10, 1.5, 3
  found = claims.claim('independent', 'fixed_size')
  assert found.relation == 'replace_one' and found.columns_relation == 'add_remove'
  sampler = sampling.FixedSizeSampler(ids, m, seed=0)
  query = (ledger_lib.GaussianSumQuery('update', CLIP, z * CLIP),)
  records = [ledger_lib.RoundRecord(r, sampler.sampling_event(r), query)
             for r in range(1, rounds + 1)]
  eps_rdp, _, relation = _claimed(records, found.relation, ('rdp',))
  moves = _per_round_differences(lambda i, s: sampling.FixedSizeSampler(i, m, seed=s), ids,
                                 relation, 1, range(3000))
  # Replacing a +1 client by a -1 one moves the sum by -2 exactly when the newcomer is drawn.
  assert set(moves) <= {0.0, -2.0}
  rate = m / len(ids)
  assert abs(np.mean(moves == -2.0) - rate) < 5 * math.sqrt(rate * (1 - rate) / moves.size)
  assert _mixture_delta(rate, -2 * CLIP / (z * CLIP), rounds, eps_rdp) <= DELTA * 1.001


def test_every_row_has_its_attack_and_unproven_pairs_are_refused():
  attacks = {name for name in globals() if name.startswith('test_')}
  for row in claims.CLAIMS:
    assert row.attack in attacks, row
  for noise, sampler in (('independent', 'shuffled'), ('independent', 'min_separation'),
                         ('tree', 'poisson'), ('correlated', 'poisson'),
                         ('correlated', 'fixed_size')):
    with pytest.raises(Exception, match='use `'):
      claims.claim(noise, sampler)
  with pytest.raises(Exception, match='bandmf only'):
    mechanisms.claim('blt', 'cyclic_poisson')


def test_docs_privacy_table_matches_the_claim_table():
  with open('docs/PRIVACY.md') as f:
    text = f.read()
  section = text.split('## Claims', 1)[1].split('\n## ', 1)[0]
  rows = [line for line in section.splitlines() if re.match(r'\| `', line)]
  found = set()
  for line in rows:
    cells = [c.strip() for c in line.strip('|').split('|')]
    noise, sampler, rate, relation, proof, attack = cells[:6]
    found.add((noise.strip('`'), sampler.strip('`'), rate.strip('`'), relation.strip('`'),
               attack.strip('`')))
  assert found == {(c.noise, c.sampler, c.rate, c.relation, c.attack) for c in claims.CLAIMS}


# The statement's headline against a seed holder, for every sampler that amplifies.

def _cyclic_records(seeded: bool, rounds=12, groups=4, q=0.5, sigma=2.0):
  ids = [f'c{i}' for i in range(80)]
  sampler = sampling.CyclicPoissonSampler(ids, groups, q, seed=1 if seeded else None,
                                          probability_given=True)
  noise = correlated.recorded(mechanisms.get('bandmf').strategy(rounds, groups, 1, bands=groups,
                                                  amplified=True), rounds, groups, 1)
  query = (ledger_lib.GaussianSumQuery('update', CLIP, sigma),)
  return [ledger_lib.RoundRecord(r, sampler.sampling_event(r), query, None, noise)
          for r in range(1, rounds + 1)], sampler


def test_a_seeded_cyclic_poisson_run_headlines_the_epsilon_against_the_seed_holder():
  """The seed holder knows every group and draw: a client can be in all 3 cycles, each of its
  participations moving one full column (norm 1) of the banded strategy, so the run is one
  Gaussian with sensitivity sqrt(3) (dp_accounting built here)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  from tff_dp.accounting import guarantee  # pylint: disable=g-import-not-at-top
  from tff_dp.run_format import release  # pylint: disable=g-import-not-at-top
  from tff_dp.training.report import privacy_statement  # pylint: disable=g-import-not-at-top
  records, sampler = _cyclic_records(seeded=True)
  against = guarantee.without_amplification(records, DELTA, ('rdp', 'pld'), 'add_remove')
  z = 2.0 / math.sqrt(3)
  assert against['rdp'] == pytest.approx(dp_accounting.rdp.RdpAccountant().compose(
      dp_accounting.GaussianDpEvent(z)).get_epsilon(DELTA), rel=1e-9)
  amplified = _claimed(records)
  assert against['pld'] > 1.5 * amplified[1]
  facts = release.RunFacts(dp=True, noise_state_in_checkpoints=True, eval_covered=True,
                           seeded=True, private_release=False)
  epsilons = {'rdp': amplified[0], 'pld': amplified[1]}
  head = guarantee.headline(records, epsilons, DELTA, ('rdp', 'pld'),
                            mechanisms.claim('bandmf', 'cyclic_poisson', True), seeded=True)
  assert head.epsilon == against and head.if_seed_secret == epsilons
  assert head.basis == 'without_amplification'
  # The one guarantee, from the records alone, is the same headline.
  assert guarantee.of_records(records, DELTA, pld_value_discretization_interval=1e-4) == head
  s = privacy_statement.statement(
      dp='bandmf', rounds_completed=12, epsilons=epsilons,
      delta=DELTA, sampling_event=sampler.sampling_event(12), facts=facts, released_columns=(),
      eval_data='holdout', headline=head)
  assert s['epsilon'] == against and s['neighboring_relation'] == 'add_remove'
  assert s['epsilon_if_seed_secret'] == {'rdp': amplified[0], 'pld': amplified[1]}
  assert 'Theorem 4' in s['proof'] and 'public' in s['population_size']
  assert 'outside the guarantee' in s['evaluation'] and 'outside_guarantee' in s
  assert f'proof: {s["proof"]}; N is treated as public' in privacy_statement.format_statement(s)
  # Without amplification in its claim, a seed changes nothing (min separation: zero-out).
  ms = sampling.build_sampler('min_separation', IDS, 10, seed=3)
  head = guarantee.headline([], {'rdp': 4.0}, DELTA, ('rdp',),
                            mechanisms.claim('blt', 'min_separation'), seeded=True)
  assert head == guarantee.Headline({'rdp': 4.0}, claims.ZERO_OUT)
  s = privacy_statement.statement(
      dp='blt', rounds_completed=12, epsilons={'rdp': 4.0}, delta=DELTA,
      sampling_event=ms.sampling_event(1), facts=facts, released_columns=(), headline=head)
  assert s['epsilon'] == {'rdp': 4.0} and s['neighboring_relation'] == claims.ZERO_OUT


# One population per run.

def test_samplers_key_on_ids_so_an_added_client_moves_no_other():
  ids = [f'c{i}' for i in range(200)]
  more = ids[:100] + ['new'] + ids[100:]
  for make in (lambda i: sampling.PoissonSampler(i, 0.1, seed=4),
               lambda i: sampling.FixedSizeSampler(i, 20, seed=4),
               lambda i: sampling.CyclicPoissonSampler(i, 4, 0.5, seed=4)):
    for r in range(1, 9):
      a, b = make(ids).sample(r), [c for c in make(more).sample(r) if c != 'new']
      if isinstance(make(ids), sampling.FixedSizeSampler):
        assert len(set(a) - set(b)) <= 1   # The newcomer displaces at most one client.
      else:
        assert a == b
  # A keyed permutation is a function of the ids, not of their order.
  key = bytes(range(32))
  forward = sampling.build_sampler('min_separation', ids, 20, key=key)
  backward = sampling.build_sampler('min_separation', ids[::-1], 20, key=key)
  assert all(sorted(forward.sample(r)) == sorted(backward.sample(r)) for r in range(1, 11))


def test_a_resume_on_another_population_is_refused(tmp_path):
  from tff_dp.training.builders import build_privacy  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'population_digest')
  digest = build_privacy._check_population(IDS, path, False, None, True)
  sampling.save_key(path, digest)
  assert build_privacy._check_population(IDS[::-1], path, True, 40, True) is None
  with pytest.raises(Exception, match='40 clients recorded, 44 now'):
    build_privacy._check_population(IDS + ['x1', 'x2', 'x3', 'x4'], path, True, 40, True)
  with pytest.raises(Exception, match='not the one this run sampled'):
    build_privacy._check_population(IDS[:-1] + ['other'], path, True, 40, True)
  with pytest.raises(Exception, match='before samplers keyed client ids'):
    build_privacy._check_population(IDS, str(tmp_path / 'none'), True, 40, True)


def test_the_accountant_refuses_a_population_that_changes_mid_run():
  query = (ledger_lib.GaussianSumQuery('update', CLIP, 1.0),)
  acc = accountant.LedgerAccountant(DELTA)
  acc.add(ledger_lib.RoundRecord(1, ledger_lib.SamplingEvent('poisson', 40, probability=0.1),
                                 query))
  with pytest.raises(Exception, match='from 44 clients, round 1 from 40'):
    acc.add(ledger_lib.RoundRecord(2, ledger_lib.SamplingEvent('poisson', 44, probability=0.1),
                                   query))


# The ledger's MAC.

def test_a_forged_ledger_with_a_recomputed_checksum_is_refused_given_the_key(tmp_path):
  import hashlib  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from run_helpers import REPO, script_env  # pylint: disable=g-import-not-at-top
  path, key_path = tmp_path / 'ledger.jsonl', tmp_path / 'ledger_key'
  key = ledger_lib.new_mac_key()
  sampling.save_key(str(key_path), key)
  event = ledger_lib.SamplingEvent('poisson', 1000, probability=0.01)
  with ledger_lib.PrivacyLedger(str(path), mac_key=key) as ledger:
    for r in range(1, 4):
      ledger.append(ledger_lib.RoundRecord(r, event,
                                           (ledger_lib.GaussianSumQuery('update', 1.0, 1.0),)))
  lines = path.read_text().splitlines()
  forged = json.loads(lines[1])
  forged['record']['queries'][0]['noise_stddev'] = 3.0   # Tripled noise: a smaller epsilon.
  body = {k: forged[k] for k in ('record', 'schema_version', 'seq')}
  forged['sha256'] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(',', ':'))
                                    .encode()).hexdigest()
  lines[1] = json.dumps(forged, sort_keys=True, separators=(',', ':'))
  path.write_text('\n'.join(lines) + '\n')
  assert ledger_lib.read_ledger(str(path))[1].queries[0].noise_stddev == 3.0   # Checksum only.
  with pytest.raises(ledger_lib.LedgerError, match='line 2: its MAC is missing or wrong'):
    ledger_lib.read_ledger(str(path), mac_key=key)
  out = subprocess.run([sys.executable, '-m', 'tff_dp.accounting', f'--ledger={path}',
                        f'--ledger_key={key_path}', '--delta=1e-5'], cwd=REPO,
                       env=script_env(), capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and 'MAC is missing or wrong' in out.stderr, out.stderr


# Canary estimates below the minimum number of canaries.

def test_too_few_canaries_give_no_point_estimate():
  from tff_dp import canaries  # pylint: disable=g-import-not-at-top
  from tff_dp.training.report import privacy_statement  # pylint: disable=g-import-not-at-top
  weights = [np.zeros(50)]
  for k, expected in ((5, None), (canaries.MIN_CANARIES_FOR_AN_ESTIMATE, float)):
    tracker = canaries.CanaryTracker(
        canaries.CanaryDirections(dim=50, num_inserted=k, num_unseen=k, seed=1), weights)
    tracker.observe_round(weights, [np.ones(50)])
    final = tracker.final_model_estimate([np.ones(50)], DELTA)
    every = tracker.all_iterates_estimate(DELTA)
    if expected is None:
      assert final is None and every is None
    else:
      assert isinstance(final.epsilon, float) and isinstance(every.epsilon, float)
  entry = privacy_statement.empirical_estimate(5, 5, {}, min_canaries=20)
  assert 'fewer than 20' in entry['too_few_canaries']
