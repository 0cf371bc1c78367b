"""The command lines' contract, generated from their declarations (issue 37): for every flag of
`run_experiment.py`, `reproduce.py`, `python -m tff_dp.accounting` and `python -m tff_dp.worker`,
values of the wrong type, empty, out of the declared bounds or outside the declared choices
(Hypothesis draws them from each flag's type, bounds, choices and checks) exit with code 2 and
one `error:` line naming the flag, no traceback, nothing written, in under 3 seconds.

The values come from the declarations (the config's fields with their `check` and `one_of`;
the absl flags' parsers with their bounds and enum values), not from a list kept here, so a
new flag is covered the day it is declared."""

import math
import os
import string
import time

from absl import flags
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from run_helpers import main_in_process
from tff_dp.training import config as config_lib
from tff_dp import sampling
from tff_dp import sections

# Bounded: every flag is its own test case with a few drawn values, so each run covers every
# flag and the whole contract takes about half a minute of the suite.
_SETTINGS = settings(max_examples=4, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.filter_too_much])
_JUNK = st.sampled_from(['', 'abc', '1e', '--', '[]', 'None ', '0x'])
_WORD = st.text(alphabet=string.ascii_lowercase + '_', min_size=1, max_size=12)


def _failing(check, values):
  predicate = check[0]

  def fails(v):
    try:
      return not predicate(v)
    except (TypeError, ValueError):
      return True
  return values.filter(fails)


def _bad_setting_values(field):
  """Values a config field must refuse: from its type, its choices and its check."""
  typ, _ = sections.base_type(field.type)
  check = field.metadata.get('check')
  one_of = field.metadata.get('one_of') or field.metadata.get('named_in')   # Both: flag enums.
  if one_of:
    return st.one_of(_JUNK, _WORD.filter(lambda s: s not in one_of))
  if typ is bool:
    return st.sampled_from(['maybe', '2', 'yes please', ''])
  if typ is int:
    bad = [_JUNK, st.floats(-1e6, 1e6).filter(lambda x: x != int(x)).map(repr)]
    if check:
      bad.append(_failing(check, st.integers(-10**9, 10**9)).map(str))
    return st.one_of(*bad)
  if typ is float:
    bad = [st.sampled_from(['', 'abc', '1e', '--', '0x'])]
    if check:
      bad.append(_failing(check, st.floats(-1e9, 1e9) | st.sampled_from(
          [math.nan, math.inf, -math.inf])).map(repr))
    return st.one_of(*bad)
  return None


def _config_flags():
  found = []
  for fields in config_lib.fields_by_section().values():
    for field in fields:
      bad = _bad_setting_values(field)
      if bad is not None:
        found.append((sections.setting_name(field), bad))
  return found


_RUN_FLAGS = _config_flags()
# absl's own flags on the global FlagValues reproduce.py uses.
_NOT_REPRODUCE = frozenset(n for n in flags.FLAGS if n not in (
    'table', 'scale', 'data_dir', 'root_output_dir', 'experiments_dir', 'arms', 'dry_run',
    'extra'))


def _bad_absl_values(flag):
  """Values an absl flag must refuse: from its parser (type, bounds, enum values)."""
  parser = flag.parser
  if isinstance(parser, flags.EnumParser):
    return st.one_of(_JUNK, _WORD.filter(lambda s: s not in parser.enum_values))
  if isinstance(parser, flags.BooleanParser):
    return st.sampled_from(['maybe', '2', 'yes please'])
  if isinstance(parser, (flags.IntegerParser, flags.FloatParser)):
    integer = isinstance(parser, flags.IntegerParser)
    bad = [_JUNK] + ([st.floats(-1e6, 1e6).filter(lambda x: x != int(x)).map(repr)]
                     if integer else [])
    low, high = parser.lower_bound, parser.upper_bound
    numbers = st.integers(-10**9, 10**9) if integer else st.floats(-1e9, 1e9)
    if low is not None:
      bad.append(numbers.filter(lambda v: v < low).map(str))
    if high is not None:
      bad.append(numbers.filter(lambda v: v > high).map(str))
    return st.one_of(*bad)
  return None


def _absl_flags(flag_values, skip=()):
  return [(name, bad) for name in sorted(flag_values) if name not in skip
          and (bad := _bad_absl_values(flag_values[name])) is not None
          and flag_values[name].name == name]


def _check_refused(program, args, name, tmp_path):
  before = sorted(os.walk(tmp_path))
  start = time.perf_counter()
  code, _, err = main_in_process(program, args)
  seconds = time.perf_counter() - start
  lines = err.strip().splitlines()
  assert code == 2, (program, args, err)
  assert len(lines) == 1 and lines[0].startswith('error: '), (program, args, err)
  assert f'--{name}' in lines[0] and 'Traceback' not in err, (program, args, err)
  assert sorted(os.walk(tmp_path)) == before, (program, args)
  assert seconds < 3.0, (program, args, seconds)


def test_every_declared_setting_is_covered():
  names = {name for name, _ in _RUN_FLAGS}
  assert len(names) > 60   # Every typed, checked or choice setting of run_experiment.py.
  assert {'noise_multiplier', 'clip', 'clients_per_round', 'dp', 'client_sampling'} <= names


@pytest.mark.parametrize('name, bad', _RUN_FLAGS, ids=[n for n, _ in _RUN_FLAGS])
@_SETTINGS
@given(data=st.data())
def test_run_experiment_refuses_every_bad_value_in_one_line(name, bad, data, tmp_path):
  value = data.draw(bad, label='value')
  args = ['--dp=fixed', '--clip=0.1', '--noise_multiplier=1', f'--root_output_dir={tmp_path}',
          f'--{name}={value}']
  _check_refused('run_experiment.py', args, name, tmp_path)


def test_the_other_command_lines_declare_flags_to_check():
  import reproduce  # pylint: disable=g-import-not-at-top
  from tff_dp import worker  # pylint: disable=g-import-not-at-top
  from tff_dp.accounting import __main__ as accounting  # pylint: disable=g-import-not-at-top
  del reproduce
  assert {'pld_every', 'method', 'rounds'} <= {n for n, _ in _absl_flags(accounting.FLAGS)}
  assert {'port'} <= {n for n, _ in _absl_flags(worker.FLAGS)}
  assert {'scale', 'dry_run'} <= {n for n, _ in _absl_flags(flags.FLAGS, _NOT_REPRODUCE)}


def _other_flags():
  import reproduce  # pylint: disable=g-import-not-at-top  (defines its flags)
  from tff_dp import worker  # pylint: disable=g-import-not-at-top
  from tff_dp.accounting import __main__ as accounting  # pylint: disable=g-import-not-at-top
  del reproduce
  return ([('accounting', n, b) for n, b in _absl_flags(accounting.FLAGS)]
          + [('worker', n, b) for n, b in _absl_flags(worker.FLAGS)]
          + [('reproduce.py', n, b) for n, b in _absl_flags(flags.FLAGS, _NOT_REPRODUCE)])


@pytest.mark.parametrize('program, name, bad', _other_flags(),
                         ids=[f'{p}-{n}' for p, n, _ in _other_flags()])
@_SETTINGS
@given(data=st.data())
def test_the_other_command_lines_refuse_every_bad_value_in_one_line(program, name, bad, data,
                                                                     tmp_path):
  from tff_dp import worker  # pylint: disable=g-import-not-at-top
  from tff_dp.accounting import __main__ as accounting  # pylint: disable=g-import-not-at-top
  value = data.draw(bad, label='value')
  if program == 'reproduce.py':
    code_args = [f'--root_output_dir={tmp_path}', f'--{name}={value}']
    _check_refused('reproduce.py', code_args, name, tmp_path)
    return
  module = accounting if program == 'accounting' else worker
  before = sorted(os.walk(tmp_path))
  args = ['--delta=1e-5'] if program == 'accounting' else ['--port=8000']
  code = _main_of(module, args + [f'--{name}={value}'])
  code_value, err = code
  lines = err.strip().splitlines()
  assert code_value == 2 and len(lines) == 1 and lines[0].startswith('error: '), (name, err)
  assert f'--{name}' in lines[0] and 'Traceback' not in err, (name, err)
  assert sorted(os.walk(tmp_path)) == before


def _main_of(module, args):
  import contextlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    code = module.main(['prog'] + args)
  return code, err.getvalue()


def _pairs_without_a_proof():
  """Every (dp kind, sampler) the flags accept one by one but the claim table has no proof for:
  generated from the declarations (`choices`), the table read only through its public lookup."""
  # pylint: disable=g-import-not-at-top
  from tff_dp import choices
  from tff_dp import mechanisms
  from tff_dp.errors import UserInputError
  pairs = []
  for kind in mechanisms.MECHANISMS:
    for sampler in sampling.KINDS:
      try:
        mechanisms.claim(kind, sampler)
      except UserInputError:
        pairs.append((kind, sampler))
  return pairs


_UNPROVEN = _pairs_without_a_proof()


def test_incompatible_pairs_are_generated_and_many():
  from tff_dp import choices  # pylint: disable=g-import-not-at-top
  from tff_dp import mechanisms  # pylint: disable=g-import-not-at-top
  kinds = len(mechanisms.MECHANISMS)
  assert kinds * len(sampling.KINDS) > len(_UNPROVEN) >= kinds   # Each kind has some.
  assert ('blt', 'poisson') in _UNPROVEN and ('adaptive', 'poisson') not in _UNPROVEN


@pytest.mark.parametrize('kind, sampler', _UNPROVEN, ids=[f'{k}-{s}' for k, s in _UNPROVEN])
def test_a_mechanism_with_a_sampler_it_has_no_proof_for_is_refused_in_one_line(kind, sampler,
                                                                               tmp_path):
  """Values valid one by one, incompatible together: the run must not start (issue 37)."""
  args = [f'--dp={kind}', '--clip=0.1', '--noise_multiplier=1', f'--client_sampling={sampler}',
          f'--root_output_dir={tmp_path}']
  _check_refused('run_experiment.py', args, 'client_sampling', tmp_path)


def _settings_of_other_mechanisms():
  """Every (mechanism's own setting, a dp kind that does not take it), from the declarations
  (`Mechanism.settings`): values valid alone, given together they would be ignored."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from tff_dp import mechanisms  # pylint: disable=g-import-not-at-top
  owned = {}
  for kind, mechanism in mechanisms.MECHANISMS.items():
    for section in mechanism.settings:
      for field in dataclasses.fields(section):
        if field.default is None:   # Unset unless given: a value says it was given.
          owned.setdefault(config_lib.setting_name(field), set()).add(kind)
  return [(name, kind) for name, kinds in sorted(owned.items())
          for kind in mechanisms.MECHANISMS if kind not in kinds]


_OTHERS = _settings_of_other_mechanisms()


def test_the_mechanisms_own_settings_give_many_incompatible_pairs():
  assert len(_OTHERS) >= 10 and ('bands', 'fixed') in _OTHERS and ('bands', 'bandmf') not in [
      (n, k) for n, k in _OTHERS]


@pytest.mark.parametrize('name, kind', _OTHERS, ids=[f'{n}-{k}' for n, k in _OTHERS])
def test_a_mechanisms_own_setting_with_another_mechanism_is_refused_in_one_line(name, kind,
                                                                                tmp_path):
  """Issue 51, item 4: pairs valid one by one, incompatible together, generated from which
  mechanism declares which setting."""
  args = [f'--dp={kind}', '--clip=0.1', '--noise_multiplier=1', f'--{name}=2',
          f'--root_output_dir={tmp_path}']
  _check_refused('run_experiment.py', args, name, tmp_path)
