r"""CLI: epsilon curve of a ledger, or noise calibration.

  python -m tff_dp.accounting --ledger RUN_DIR/ledger.jsonl \
      --ledger_key RUN_DIR/secret/ledger_key --delta 1e-6 [--method both]
      prints the run's headline (`# headline: ...`, as its statement), then CSV
      `round,epsilon_rdp,epsilon_pld` (PLD every --pld_every-th row and the last). Without
      --ledger_key a MAC'd ledger is read unverified, labelled so on stdout and stderr.
  python -m tff_dp.accounting --repair RUN_DIR/ledger.jsonl
      moves a partial last line (a crash mid-write) to ledger.jsonl.corrupt-TIME, so the
      ledger can be replayed; `--resume` does the same by itself.
  python -m tff_dp.accounting --target_epsilon 5 --rounds 1500 --clients_per_round 100 \
      --population 342477 [--clipped_count_stddev 5] --delta 1e-6
      prints the effective noise multiplier z and the update-query multiplier.
  python -m tff_dp.accounting --target_epsilon 8.2 --mechanism=tree --rounds 1600 \
      --clients_per_round 100 --population 342477 --delta 1e-6
      calibrates the per-node multiplier of tree aggregation (DP-FTRL, shuffled participation,
      replace-special neighbouring; RDP only).
  python -m tff_dp.accounting --target_epsilon 8.9 --mechanism=blt --rounds 2000 \
      --min_separation 313 --max_participations 7 --delta 1e-10
      calibrates correlated-noise DP-FTRL (blt or bandmf) under min-separation participation
      (the run is one Gaussian mechanism) and prints the strategy: buf_decay=[...] and
      output_scale=[...] for BLT, bands for BandMF, its sensitivity and loss.
  python -m tff_dp.accounting --plan --rounds 2000 --population 1000000 --delta 1e-7 \
      --plan_noise_multipliers 0.5,0.8,1,1.5 --clients_per_round 5000 --target_epsilon 2 \
      [--plan_cohorts 1000,5000] [--plan_output privacy_plan.png]
      the privacy planner: epsilon (RDP) against rounds for each noise multiplier and cohort
      size, for DP-FedAvg, the tree, BLT / BandMF (and amplified BandMF with --bands); prints
      a table, draws the PNG.

Bad input: one line on stderr, exit code 2. That includes a --ledger that is missing, a
directory, or not a valid ledger (a truncated or edited line, or a deleted, duplicated or
reordered line: tff_dp.ledger.read_ledger names the line).
"""

import math
import os
import sys

from absl import flags

from tff_dp import choices
from tff_dp import cli_flags
from tff_dp import errors
from tff_dp import ledger
from tff_dp import mechanisms
from tff_dp import sampling
from tff_dp.accounting import noise_families

FLAGS = flags.FlagValues()
flags.DEFINE_string('ledger', None, 'Path of a ledger.jsonl to replay (curve mode).',
                    flag_values=FLAGS)
flags.DEFINE_string('ledger_key', None, 'With --ledger: the run\'s secret/ledger_key; every '
                    'line\'s MAC is verified with it, so a forged line (edited, its checksum '
                    'recomputed) is refused.', flag_values=FLAGS)
flags.DEFINE_string('ledger_seal', None, 'With --ledger_key: the run\'s secret/ledger_seal '
                    '(default: ledger_seal beside the key); a ledger cut short is refused.',
                    flag_values=FLAGS)
flags.DEFINE_float('delta', None, 'Target delta, in (0, 1). Required.', flag_values=FLAGS)
flags.DEFINE_enum('method', 'both', ['rdp', 'pld', 'both'],
                  'Accountant(s) to use. Calibration uses rdp when "both".', flag_values=FLAGS)
flags.DEFINE_enum('neighboring', None, ['add_remove', 'replace_one', 'replace_special'],
                  'Neighbouring relation. add_remove: Poisson exact, fixed-size approximated '
                  'as Poisson(m/N). replace_one: fixed-size sampling only, RDP only. '
                  'replace_special (zero-out): tree aggregation (DP-FTRL) and correlated noise '
                  'under min separation. Default: the relation the ledger\'s claim is proven '
                  'under (docs/PRIVACY.md, "Claims"); another is refused.',
                  flag_values=FLAGS)
_CORRELATED = ' / '.join(mechanisms.with_noise(noise_families.CORRELATED))
flags.DEFINE_enum('mechanism', 'gaussian',
                  ['gaussian', 'tree'] + mechanisms.with_noise(noise_families.CORRELATED),
                  'Calibration mode: gaussian (DP-FedAvg: independent noise each round), '
                  'tree (DP-FTRL: tree-aggregation noise over epochs of shuffled '
                  f'participation, N // m rounds each), or {_CORRELATED} (correlated-noise '
                  'DP-FTRL under --min_separation and --max_participations).',
                  flag_values=FLAGS)
flags.DEFINE_integer('min_separation', None, f'Calibration, {_CORRELATED}: rounds between two '
                     'participations of a client, at least.', flag_values=FLAGS)
flags.DEFINE_integer('max_participations', None, f'Calibration, {_CORRELATED}: '
                     'participations of a client, at most.', flag_values=FLAGS)
flags.DEFINE_integer('bands', None, f'Calibration, {" / ".join(mechanisms.with_setting("bands"))}'
                     ': bands of the strategy (default --min_separation).', flag_values=FLAGS)
flags.DEFINE_integer('pld_every', None, 'Curve mode: compute PLD every this many records '
                     '(default: about 20 points). Each PLD evaluation costs ~0.2-2 s at the '
                     'default --pld_discretization, ~10x more at 1e-4.', flag_values=FLAGS)
flags.DEFINE_float('pld_discretization', 1e-3, 'Curve mode: PLD value discretization interval '
                   '(what runs use; dp_accounting discretizes pessimistically, so any grid '
                   'gives an upper bound; 1e-4 agreed to 8 digits here and is ~10x slower).',
                   flag_values=FLAGS)
flags.DEFINE_string('repair', None, 'Path of a ledger whose partial last line to move aside.',
                    flag_values=FLAGS)
flags.DEFINE_float('target_epsilon', None, 'Calibration mode: target epsilon.',
                   flag_values=FLAGS)
flags.DEFINE_integer('rounds', None, 'Calibration mode: planned number of rounds.',
                     flag_values=FLAGS)
flags.DEFINE_integer('clients_per_round', None,
                     'Calibration mode: (expected) clients per round m.', flag_values=FLAGS)
flags.DEFINE_integer('population', None, 'Calibration mode: number of clients N (q = m/N).',
                     flag_values=FLAGS)
flags.DEFINE_float('clipped_count_stddev', None,
                   'Calibration mode, adaptive clipping: stddev sigma_b of the clipped-count '
                   'sum (TFF default 0.05 * clients_per_round). Omit for fixed clipping.',
                   flag_values=FLAGS)
flags.DEFINE_bool('plan', False, 'Planner mode: epsilon against rounds for a grid of noise '
                  'multipliers (--plan_noise_multipliers) and cohort sizes (--plan_cohorts, '
                  'or --clients_per_round), for each mechanism; --target_epsilon is marked.',
                  flag_values=FLAGS)
flags.DEFINE_list('plan_noise_multipliers', None, 'Planner: noise multipliers z to draw.',
                  flag_values=FLAGS)
flags.DEFINE_list('plan_cohorts', None, 'Planner: clients per round to draw (default '
                  '--clients_per_round).', flag_values=FLAGS)
flags.DEFINE_list('plan_mechanisms', None, 'Planner: mechanisms to draw (default: gaussian, '
                  'tree, correlated, and amplified_bandmf when --bands is given).',
                  flag_values=FLAGS)
flags.DEFINE_string('plan_output', 'privacy_plan.png', 'Planner: the PNG to write.',
                    flag_values=FLAGS)
flags.DEFINE_enum('sampling', 'poisson', list(sampling.KINDS),
                  'Calibration mode: client sampling scheme.', flag_values=FLAGS)

# The largest PLD grid accepted: a coarser one still gives an upper bound, but a loose one
# (at 100, epsilon 699 for a run of epsilon 5) that reads like a number about the run.
MAX_PLD_DISCRETIZATION = 0.1
flags.register_validator(
    'pld_discretization', lambda v: v is not None and 0 < v <= MAX_PLD_DISCRETIZATION,
    f'must be in (0, {MAX_PLD_DISCRETIZATION:g}]', flag_values=FLAGS)
for _name in ('min_separation', 'max_participations', 'bands', 'pld_every', 'rounds',
              'clients_per_round', 'population'):
  flags.register_validator(_name, lambda v: v is None or v >= 1, 'must be a positive integer',
                           flag_values=FLAGS)
for _name in ('plan_noise_multipliers', 'plan_cohorts', 'plan_mechanisms'):
  flags.register_validator(_name, lambda v: v is None or len(set(v)) == len(v),
                           'lists each value once', flag_values=FLAGS)
  flags.register_validator(_name, lambda v: v is None or (v and all(v)),
                           'must list at least one value', flag_values=FLAGS)
flags.register_validator('target_epsilon', lambda v: v is None or 0 < v < math.inf,
                         'must be a positive number', flag_values=FLAGS)
MAX_PLAN_ROUNDS = 100_000   # The planner's cost grows with the rounds (1e9 took 2.7 GB in 2 min).


def _existing(path: str) -> str:
  path = cli_flags.path(path)
  ledger.check_resumable(path)   # A damaged ledger is refused, never truncated.
  if not os.path.isfile(path):
    raise errors.UserInputError(f'--repair {path}: no such ledger file.')
  return path


def _mac_key():
  """The --ledger_key's bytes (None without the flag)."""
  if FLAGS.ledger_key is None:
    return None
  try:
    key = sampling.load_key(cli_flags.path(FLAGS.ledger_key), what='ledger key')
  except OSError as e:
    raise errors.UserInputError(f'--ledger_key {FLAGS.ledger_key}: {e.strerror or e}.') from None
  if key is None:
    raise errors.UserInputError(f'--ledger_key {FLAGS.ledger_key} does not exist.')
  return key


def _curve() -> None:
  from tff_dp.accounting import replay  # pylint: disable=g-import-not-at-top

  def progress(done: int, total: int) -> None:   # On stderr: stdout is the CSV.
    print(f'\raccounted {done}/{total} rounds', end='' if done < total else '\n',
          file=sys.stderr, flush=True)

  found = replay.replay(
      cli_flags.path(FLAGS.ledger), FLAGS.delta,
      tuple(choices.ACCOUNTANTS) if FLAGS.method == 'both' else (FLAGS.method,),
      mac_key=_mac_key(),
      seal_path=cli_flags.path(FLAGS.ledger_seal) if FLAGS.ledger_seal else None,
      key_path=cli_flags.path(FLAGS.ledger_key) if FLAGS.ledger_key else None,
      relation=FLAGS.neighboring, pld_every=FLAGS.pld_every,
      progress=progress if sys.stderr.isatty() else None,
      pld_discretization=FLAGS.pld_discretization)
  for note in found.notes:
    print(f'warning: {note}', file=sys.stderr)
  if not found.verified:
    print('warning: verify it with --ledger_key RUN_DIR/secret/ledger_key', file=sys.stderr)
  print('\n'.join(found.lines()))


def _calibrate_amplified() -> None:
  """Amplified BandMF: cyclic Poisson over --bands groups (`correlated` module docstring)."""
  from tff_dp.accounting import correlated  # pylint: disable=g-import-not-at-top
  for name in ('rounds', 'bands', 'clients_per_round', 'population'):
    if FLAGS[name].value is None:
      raise errors.UserInputError(f'--sampling={FLAGS.sampling} needs --{name}.')
  for name in ('min_separation', 'max_participations', 'clipped_count_stddev'):
    if FLAGS[name].present:
      raise errors.UserInputError(f'--sampling={FLAGS.sampling} visits each of --bands groups '
                                  f'every --bands rounds, with a fixed clip: drop --{name}.')
  correlated.delta_lib.check_delta(FLAGS.delta, FLAGS.population)
  q = sampling.cyclic_poisson_probability(FLAGS.population, FLAGS.clients_per_round,
                                          FLAGS.bands)
  cycles = math.ceil(FLAGS.rounds / FLAGS.bands)
  method = 'rdp' if FLAGS.method == 'both' else FLAGS.method
  z = correlated.calibrate(FLAGS.target_epsilon, FLAGS.delta, method, probability=q,
                           compositions=cycles)
  found = mechanisms.get(FLAGS.mechanism).strategy(FLAGS.rounds, FLAGS.bands, cycles,
                                                   bands=FLAGS.bands, amplified=True)
  print(f'noise_multiplier={z!r}')
  print('\n'.join(correlated.describe(found)))
  print(f'epsilon={correlated.amplified_epsilon(q, z, cycles, FLAGS.delta, method)!r} '
        f'delta={FLAGS.delta!r} rounds={FLAGS.rounds} method={method} '
        f'neighboring={mechanisms.claim(FLAGS.mechanism, FLAGS.sampling).relation} '
        f'sampling={FLAGS.sampling}(q={q!r}, {FLAGS.bands} groups, {cycles} cycles)')


def _calibrate_correlated() -> None:
  from tff_dp.accounting import correlated  # pylint: disable=g-import-not-at-top
  if sampling.get(FLAGS.sampling).grouped:
    _calibrate_amplified()
    return
  for name in ('rounds', 'min_separation', 'max_participations'):
    if FLAGS[name].value is None:
      raise errors.UserInputError(f'--mechanism={FLAGS.mechanism} needs --{name}.')
  for name in ('sampling', 'clients_per_round', 'clipped_count_stddev'):
    if FLAGS[name].present:
      raise errors.UserInputError(
          f'--mechanism={FLAGS.mechanism} is calibrated for min-separation participation '
          f'without amplification: drop --{name}.')
  least = math.ceil(FLAGS.rounds / FLAGS.min_separation)
  if FLAGS.max_participations < least:   # The schedule allows that many: a weaker claim.
    raise errors.UserInputError(
        f'--max_participations={FLAGS.max_participations}: {FLAGS.rounds} rounds at least '
        f'{FLAGS.min_separation} apart allow {least} participations of a client; give '
        f'--max_participations >= {least}.')
  if FLAGS.population is not None:
    correlated.delta_lib.check_delta(FLAGS.delta, FLAGS.population)
  method = 'rdp' if FLAGS.method == 'both' else FLAGS.method
  z = correlated.calibrate(FLAGS.target_epsilon, FLAGS.delta, method)
  found = mechanisms.get(FLAGS.mechanism).strategy(
      FLAGS.rounds, FLAGS.min_separation, FLAGS.max_participations, bands=FLAGS.bands)
  print(f'noise_multiplier={z!r}')
  print('\n'.join(correlated.describe(found)))
  print(f'epsilon={correlated.gaussian_epsilon(z, FLAGS.delta, method)!r} '
        f'delta={FLAGS.delta!r} rounds={FLAGS.rounds} method={method} '
        f'neighboring={mechanisms.claim(FLAGS.mechanism, "min_separation").relation} '
        f'participation=min_separation({FLAGS.min_separation}, at most '
        f'{FLAGS.max_participations})')


def _plan() -> None:
  """Planner mode: the table on stdout, the picture at --plan_output."""
  from tff_dp.accounting import planner  # pylint: disable=g-import-not-at-top
  for name in ('rounds', 'population', 'plan_noise_multipliers'):
    if FLAGS[name].value is None:
      raise errors.UserInputError(f'--plan needs --{name}.')
  if FLAGS.rounds > MAX_PLAN_ROUNDS:
    raise errors.UserInputError(f'--rounds={FLAGS.rounds}: the planner draws at most '
                                f'{MAX_PLAN_ROUNDS:,} rounds.')
  cohorts = cli_flags.numbers(FLAGS, 'plan_cohorts', int) or (
      [FLAGS.clients_per_round] if FLAGS.clients_per_round is not None else [])
  if not cohorts:
    raise errors.UserInputError('--plan needs --plan_cohorts or --clients_per_round.')
  output = cli_flags.path(FLAGS.plan_output)
  if not output.endswith('.png') or not os.path.isdir(os.path.dirname(output) or '.'):
    raise errors.UserInputError(f'--plan_output {FLAGS.plan_output}: must be a .png in an '
                                'existing directory.')
  found = planner.curves(
      total_rounds=FLAGS.rounds, population=FLAGS.population, delta=FLAGS.delta,
      noise_multipliers=cli_flags.numbers(FLAGS, 'plan_noise_multipliers', float), cohort_sizes=cohorts,
      mechanisms=FLAGS.plan_mechanisms, bands=FLAGS.bands)
  target = FLAGS.target_epsilon
  print(f'mechanism,noise_multiplier,clients_per_round,epsilon_rdp_after_{FLAGS.rounds}'
        + (f',rounds_within_epsilon_{target:g}' if target is not None else ''))
  for c in found:
    print(f'{c.mechanism},{c.noise_multiplier:g},{c.clients_per_round},{c.epsilons[-1]:.6g}'
          + (f',{c.rounds_within(target)}' if target is not None else ''))
  from tff_dp.accounting import plan_plot  # pylint: disable=g-import-not-at-top
  plan_plot.draw(found, output, delta=FLAGS.delta, population=FLAGS.population,
                 target_epsilon=target,
                 descriptions=dict(planner.MECHANISMS, amplified_bandmf=(
                     f'amplified BandMF: cyclic Poisson over {FLAGS.bands} groups')),
                 notes=planner.Z_MEANS)
  print(f'plot: {output}', file=sys.stderr)


def _calibrate() -> None:
  from tff_dp.accounting import calibration  # pylint: disable=g-import-not-at-top
  if FLAGS.mechanism in mechanisms.with_noise(noise_families.CORRELATED):
    _calibrate_correlated()
    return
  for name in ('rounds', 'clients_per_round', 'population'):
    if FLAGS[name].value is None:
      raise errors.UserInputError(f'--target_epsilon needs --{name}.')
  if FLAGS.mechanism == 'tree' and FLAGS['sampling'].present:
    raise errors.UserInputError('--mechanism=tree is calibrated for shuffled participation '
                                'only (the tree has no amplification by sampling); drop '
                                '--sampling.')
  result = calibration.calibrate_noise_multiplier(
      FLAGS.target_epsilon, FLAGS.delta, FLAGS.rounds,
      population_size=FLAGS.population, clients_per_round=FLAGS.clients_per_round,
      clipped_count_stddev=FLAGS.clipped_count_stddev, sampling=FLAGS.sampling,
      neighboring_relation=FLAGS.neighboring, mechanism=FLAGS.mechanism,
      method='rdp' if FLAGS.method == 'both' else FLAGS.method)
  print(f'noise_multiplier={result.noise_multiplier!r}')
  print(f'update_noise_multiplier={result.update_noise_multiplier!r}')
  print(f'epsilon={result.epsilon!r} delta={result.delta!r} rounds={result.rounds} '
        f'method={result.method} neighboring={result.neighboring_relation} '
        f'sampling={result.sampling}')


def main(argv) -> int:
  try:
    if cli_flags.parse(FLAGS, argv, __doc__) == 0:
      return 0
    if FLAGS.repair is not None:
      moved = ledger.repair_truncated_tail(_existing(FLAGS.repair))
      print(f'moved the partial last line to {moved}' if moved else
            f'{FLAGS.repair} ends with a complete line: nothing to repair')
      return 0
    if FLAGS.ledger is None and FLAGS.target_epsilon is None and not FLAGS.plan:
      raise errors.UserInputError('give a mode: --ledger (replay a run\'s ledger), '
                                  '--target_epsilon (calibrate the noise), --plan (the privacy '
                                  'planner), or --repair (a ledger\'s partial last line).')
    if FLAGS.delta is None:
      raise errors.UserInputError('--delta is required.')
    cli_flags.refuse_unchosen(FLAGS, {   # The flags only one mode reads.
        'plan': (FLAGS.plan, ('plan_noise_multipliers', 'plan_cohorts', 'plan_mechanisms',
                              'plan_output')),
        'ledger': (FLAGS.ledger is not None, ('ledger_key', 'ledger_seal', 'pld_every',
                                              'pld_discretization'))})
    if FLAGS.plan:
      if FLAGS.ledger is not None:
        raise errors.UserInputError('--plan draws planned runs and --ledger replays a run: '
                                    'give one of them.')
      _plan()
      return 0
    if (FLAGS.ledger is None) == (FLAGS.target_epsilon is None):
      raise errors.UserInputError('give exactly one of --ledger (epsilon curve) or '
                                  '--target_epsilon (calibration).')
    if FLAGS.ledger is not None:
      _curve()
    else:
      _calibrate()
  except errors.UserInputError as e:
    return cli_flags.report(e, FLAGS)
  return 0


if __name__ == '__main__':
  sys.exit(cli_flags.run_program(main, sys.argv, 'nothing was written but what was printed'))
