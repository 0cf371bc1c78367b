"""Benchmark: epsilon after every round of a 10,000-round ledger, incremental vs from scratch.

Ledger: adaptive clipping (an 'update' query with a float32 clip that drifts every round and
stddev = clip * z_v, plus the 'clipped_count' query), Poisson sampling q = 100 / 342477
(StackOverflow-sized). The float32 values make the exact z_eff differ in its last bits every
round, so every round is a distinct event for the accountant. Measured:
  0. the replay `python -m tff_dp.accounting --ledger` does, of a 1500-round such ledger
     (read_ledger + epsilon_curve: exact RDP after every record, then also PLD at ~20
     points), in seconds (the target: a few seconds);
  1. read_ledger of the 10,000-line file;
  2. LedgerAccountant.add + epsilon (RDP) after every round (the target: < 30 s);
  3. from scratch with dp_accounting only (fresh RdpAccountant composing every
     record_to_dp_event so far) at a few small rounds t; its cost is linear in t, so the
     total for reporting after all T rounds, sum_t c * t = c T (T + 1) / 2, is extrapolated
     from the fitted per-event cost c (stated as an extrapolation, not measured);
  4. optionally (--with_pld) the PLD curve with the default ~20 evaluation points;
  5. a PLD report after every round of a fixed-z ledger (`--pld_every=1` in a run, the run's
     1e-3 grid; z = 0.7, q = 0.1): ours, which keeps the round's PLD once built, against a
     dp_accounting `PLDAccountant` composing each round as it comes (which builds that PLD at
     every compose, as ours did before), interleaved round by round, same epsilon checked.

  .venv/bin/python benchmarks/bench_accountant.py [--rounds 10000] [--replay_rounds 1500]
      [--with_pld] [--pld_report_rounds 50]
"""

import argparse
import os
import sys
import tempfile
import time

import dp_accounting
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_args  # noqa: E402  (no TensorFlow)

# pylint: disable=g-import-not-at-top,wrong-import-position
from tff_dp import ledger
from tff_dp.accounting import accountant
from tff_dp.accounting import calibration
# pylint: enable=g-import-not-at-top,wrong-import-position

DELTA = 1e-6


def make_records(rounds):
  population, m, z, sigma_b = 342477, 100, 1.0, 5.0
  z_v = calibration.update_noise_multiplier(z, sigma_b)
  sampling = ledger.SamplingEvent('poisson', population, probability=m / population)
  rng = np.random.default_rng(0)
  clip = np.float32(0.1)
  records = []
  for t in range(1, rounds + 1):
    clip = np.float32(clip * np.exp(rng.normal(0, 0.02)))  # Geometric clip updates.
    records.append(ledger.RoundRecord(t, sampling, (
        ledger.GaussianSumQuery('update', clip, np.float32(clip * np.float32(z_v))),
        ledger.GaussianSumQuery('clipped_count', 0.5, np.float32(sigma_b)))))
  return records


def _write_ledger(path, records):
  with open(path, 'wb') as f:  # Bulk write (no per-line fsync): we time reading only.
    f.write(b''.join(ledger.encode_record(r, seq) for seq, r in enumerate(records, 1)))


def replay_adaptive_ledger(rounds):
  """Seconds to replay a `rounds`-round adaptive ledger as the accounting CLI does."""
  records = make_records(rounds)
  distinct = len({accountant.collapsed_dp_event(r) for r in records})
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'ledger.jsonl')
    _write_ledger(path, records)
    for methods in (('rdp',), ('rdp', 'pld')):
      t0 = time.perf_counter()
      curve = accountant.epsilon_curve(ledger.read_ledger(path), DELTA, methods)
      seconds = time.perf_counter() - t0
      pld = curve[-1]['epsilon_pld']
      print(f'replay of a {rounds}-round adaptive ledger ({distinct} distinct z_eff), '
            f'{"+".join(methods)}: {seconds:.2f} s (final eps_rdp = '
            f'{curve[-1]["epsilon_rdp"]:.6f}' + (f', eps_pld = {pld:.6f}' if pld else '')
            + f' at delta = {DELTA:g})')


# `--smoke`: the smallest settings, which the test suite runs (bench_args).
SMOKE = ['--rounds=50', '--replay_rounds=20', '--pld_report_rounds=3']


def fixed_z_pld_reports(rounds: int, z: float = 0.7, q: float = 0.1) -> None:
  """Item 5 of the module docstring."""
  sampling = ledger.SamplingEvent('poisson', 1000, probability=q)
  ours = accountant.LedgerAccountant(DELTA, ('pld',), pld_value_discretization_interval=1e-3)
  plain = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3)
  event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
  t_ours = t_plain = 0.0
  for t in range(1, rounds + 1):
    t0 = time.perf_counter()
    ours.add(ledger.RoundRecord(t, sampling, (ledger.GaussianSumQuery('update', 1.0, z),)))
    eps_ours = ours.epsilon_pld()
    t1 = time.perf_counter()
    eps_plain = plain.compose(event).get_epsilon(DELTA)
    t_ours, t_plain = t_ours + t1 - t0, t_plain + time.perf_counter() - t1
    assert eps_ours == eps_plain, (t, eps_ours, eps_plain)
  print(f'PLD after every round of a fixed-z ledger (z={z}, q={q}, {rounds} rounds): '
        f'{t_ours / rounds * 1e3:.1f} ms a report against {t_plain / rounds * 1e3:.1f} ms '
        f'composing each round afresh ({t_plain / t_ours:.1f}x); the same epsilon, '
        f'{eps_ours:.4f}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--rounds', type=int, default=10000)
  parser.add_argument('--replay_rounds', type=int, default=1500)
  parser.add_argument('--with_pld', action='store_true', help='Also time the PLD curve.')
  parser.add_argument('--pld_report_rounds', type=int, default=50)
  args = bench_args.parse(parser, SMOKE)
  fixed_z_pld_reports(args.pld_report_rounds)
  replay_adaptive_ledger(args.replay_rounds)
  records = make_records(args.rounds)

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'ledger.jsonl')
    _write_ledger(path, records)
    t0 = time.perf_counter()
    records = ledger.read_ledger(path)
    t_read = time.perf_counter() - t0
  print(f'read_ledger: {len(records)} lines in {t_read:.2f} s')

  t0 = time.perf_counter()
  acc = accountant.LedgerAccountant(DELTA, methods=('rdp',))
  curve = []
  for r in records:
    acc.add(r)
    curve.append(acc.epsilon_rdp())
  t_incr = time.perf_counter() - t0
  distinct = len({accountant.collapsed_dp_event(r) for r in records})
  print(f'incremental RDP, epsilon after each of {len(records)} rounds: {t_incr:.2f} s '
        f'(final eps = {curve[-1]:.4f} at delta = {DELTA:g}; '
        f'{distinct} distinct per-round events)')

  sample_rounds = [10, 20, 40]
  costs = []
  for t in sample_rounds:
    t0 = time.perf_counter()
    scratch = dp_accounting.rdp.RdpAccountant()
    for r in records[:t]:
      scratch.compose(accountant.record_to_dp_event(r))
    eps = scratch.get_epsilon(DELTA)
    dt = time.perf_counter() - t0
    costs.append(dt / t)
    assert abs(eps - curve[t - 1]) <= 1e-9 * eps, (eps, curve[t - 1])
    print(f'from scratch at round {t}: {dt:.2f} s ({dt / t * 1e3:.1f} ms/event), '
          f'eps {eps:.6f} vs incremental {curve[t - 1]:.6f}')
  per_event = float(np.median(costs))
  n = len(records)
  total_scratch = per_event * n * (n + 1) / 2
  print(f'EXTRAPOLATED from-scratch total for epsilon after every round: '
        f'{per_event * 1e3:.1f} ms/event * T(T+1)/2 = {total_scratch:.3g} s '
        f'(~{total_scratch / 86400:.1f} days); even one from-scratch epsilon at round {n} '
        f'is ~{per_event * n:.0f} s')
  print(f'ratio from-scratch / incremental: ~{total_scratch / t_incr:.3g}x '
        f'(extrapolated); target incremental < 30 s: '
        f'{"OK" if t_incr < 30 else "MISSED"}')

  if args.with_pld:
    t0 = time.perf_counter()
    pld_curve = accountant.epsilon_curve(records, DELTA, methods=('pld',))
    t_pld = time.perf_counter() - t0
    points = [p for p in pld_curve if p['epsilon_pld'] is not None]
    print(f'PLD curve: {len(points)} evaluations in {t_pld:.1f} s; final eps_pld = '
          f'{points[-1]["epsilon_pld"]:.4f} (RDP {curve[-1]:.4f})')


if __name__ == '__main__':
  main()
