"""A mechanism is one module (issue 38, item 1): the registry's declarations are what the package
reads, no module outside tff_dp/mechanisms/ compares a mechanism's name, each mechanism's claims
are the claim table's rows for its noise and samplers, and a mechanism defined in this file
registers, runs, is accounted and stated without a package file changing."""

import ast
import collections
import dataclasses
import importlib
import json
import os
import pathlib
import re

import dp_accounting
import numpy as np
import pytest

from run_helpers import REPO
from run_helpers import metrics_rows
from run_helpers import run_stopped_after
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp import privacy
from tff_dp import sampling
from tff_dp.accounting import claims
from tff_dp.accounting import noise_families
from tff_dp.errors import UserInputError
from tff_dp.training import config as config_lib
from tff_dp.training import config_flags
from tff_dp.training.builders import build_privacy

BUILT_IN = frozenset(mechanisms.MECHANISMS)


def name_compares(source: str, names=BUILT_IN) -> list[tuple[int, str]]:
  """(line, name) of every comparison of a value with one of `names`: `==`, `!=`, `is`, and
  `in` / `not in` a literal tuple, list, set or dict holding one."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Compare):
      continue
    for operand in [node.left, *node.comparators]:
      literals = ([operand] if isinstance(operand, ast.Constant) else
                  list(operand.elts) if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else
                  list(operand.keys) if isinstance(operand, ast.Dict) else [])
      found += [(node.lineno, c.value) for c in literals
                if isinstance(c, ast.Constant) and c.value in names]
  return found


def name_tables(source: str, names=BUILT_IN) -> list[tuple[int, str]]:
  """(line, name) of every literal tuple, list, set or dict (keys) holding one of `names`: a
  list of mechanisms, or a table keyed by them, kept beside the registry."""
  found = []
  for node in ast.walk(ast.parse(source)):
    elements = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else
                node.keys if isinstance(node, ast.Dict) else [])
    found += [(e.lineno, e.value) for e in elements
              if isinstance(e, ast.Constant) and e.value in names]
  return found


def test_the_checker_finds_name_compares_and_nothing_else():
  source = ("a = kind == 'blt'\nb = 'bandmf' != kind\nc = kind in ('ftrl', 'x')\n"
            "d = kind not in {'joint': 1}\ne = kind == 'none'\nf = table['blt']\n"
            "g = kind in TREE\nh = 'fixed'\n")
  assert name_compares(source) == [(1, 'blt'), (2, 'bandmf'), (3, 'ftrl'), (4, 'joint')]
  assert name_tables(source) == [(3, 'ftrl'), (4, 'joint')]
  assert name_tables("KINDS = ['x', 'bandmf']\nT = {'blt': f}\n") == [(1, 'bandmf'), (2, 'blt')]


def test_no_module_outside_mechanisms_compares_or_lists_a_mechanism_name():
  package = pathlib.Path(REPO) / 'tff_dp'
  found = {}
  for path in sorted(package.rglob('*.py')):
    if path.relative_to(package).parts[0] == 'mechanisms':
      continue
    hits = name_compares(path.read_text()) + name_tables(path.read_text())
    if hits:
      found[str(path.relative_to(REPO))] = hits
  # The same word as another setting's choice: `canary_inclusion=fixed`.
  assert found == {'tff_dp/choices.py': [(_line_of('CANARY_INCLUSIONS = {') + 1, 'fixed')]}
  assert len(list(package.rglob('*.py'))) > 100   # The walk saw the package.


def _line_of(text: str) -> int:
  lines = (pathlib.Path(REPO) / 'tff_dp' / 'choices.py').read_text().splitlines()
  return next(i for i, line in enumerate(lines, 1) if line.startswith(text))


def test_each_mechanisms_claims_are_the_claim_tables_rows_for_its_noise_and_samplers():
  used = set()
  for name, mechanism in mechanisms.MECHANISMS.items():
    for sampler in sampling.KINDS:
      if sampler in mechanism.samplers:
        assert mechanisms.claim(name, sampler) == claims.claim(mechanism.noise.name, sampler)
        used.add((mechanism.noise.name, sampler))
      else:
        with pytest.raises(UserInputError, match=f'client_sampling|{sampler}'):
          mechanisms.claim(name, sampler)
  # Every proven row serves a mechanism; amplification covers the banded strategy only.
  assert used == {(c.noise, c.sampler) for c in claims.CLAIMS}
  assert [n for n, m in mechanisms.MECHANISMS.items() if 'cyclic_poisson' in m.samplers] == [
      'bandmf']


def test_a_mechanism_that_lists_a_sampler_without_a_proof_cannot_be_declared():
  with pytest.raises(UserInputError, match='no proof with poisson sampling'):
    mechanisms.Mechanism(name='unproven', description='', noise=noise_families.TREE,
                         samplers=('poisson',),
                         build_factory=lambda *a: None)
  with pytest.raises(ValueError, match='already'):
    mechanisms.register(mechanisms.MECHANISMS['fixed'])


TOY = 'toy_double_noise'


def _toy_factory(request: mechanisms.FactoryRequest):
  """Fixed clipping with twice the noise of `fixed`, built from the library's public parts."""
  # pylint: disable=g-import-not-at-top  (TensorFlow: only when the run builds it)
  import tensorflow_privacy as tfp
  from tff_dp.aggregators import privacy_queries
  from tff_dp.aggregators import reporting
  clip = request.clip
  query = tfp.NormalizedQuery(
      tfp.GaussianSumQuery(l2_norm_clip=clip, stddev=2 * request.noise_multiplier * clip),
      denominator=request.clients_per_round)
  return reporting.ReportingDPFactory(query, lambda state: collections.OrderedDict(
      update=privacy_queries.query_tuple(state.numerator_state.l2_norm_clip,
                                         state.numerator_state.stddev)))


@pytest.fixture
def toy_mechanism():
  mechanisms.register(mechanisms.Mechanism(
      name=TOY, description='fixed clip, twice the noise', noise=noise_families.INDEPENDENT,
      samplers=('poisson',), build_factory=_toy_factory))
  yield
  del mechanisms.MECHANISMS[TOY]


def test_a_registered_mechanisms_unlisted_sampler_is_refused_with_the_config(toy_mechanism):
  """Issue 52, item 3: the config checked the noise kind's claims, not the mechanism's own
  samplers, so `dp=<toy> client_sampling=fixed_size` was refused after TensorFlow loaded. The
  config (built before TensorFlow) now asks the registry."""
  from tff_dp.training.config import ExperimentConfig  # pylint: disable=g-import-not-at-top
  from tff_dp.errors import UserInputError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UserInputError, match=f'`dp={TOY}` has no analysis of it'):
    ExperimentConfig.from_settings(dp=TOY, clip=0.1, noise_multiplier=1.0,
                                   client_sampling='fixed_size')
  assert ExperimentConfig.from_settings(dp=TOY, clip=0.1, noise_multiplier=1.0,
                                        client_sampling='poisson').dp.kind == TOY


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_mechanism_defined_here_runs_is_accounted_and_stated(toy_mechanism, tag_task,
                                                                 tmp_path):
  z, clip, m, delta = 0.7, 0.1, 5, 1e-3
  settings = dict(task='stackoverflow_tag', dp=TOY, clip=clip, noise_multiplier=z,
                  clients_per_round=m, total_rounds=2, rounds_per_eval=2, max_eval_examples=20,
                  delta=delta, root_output_dir=str(tmp_path))
  assert run_stopped_after(settings, tag_task, 'toy').rounds_completed == 2
  run_dir = tmp_path / 'toy'
  records = ledger_lib.read_ledger(str(run_dir / 'ledger.jsonl'))
  # The ledger holds what the toy's factory executed: twice `fixed`'s noise.
  assert [(q.l2_norm_clip, q.noise_stddev) for r in records for q in r.queries] == [
      pytest.approx((clip, 2 * z * clip))] * 2
  population = json.loads((run_dir / 'config.json').read_text())['population_size']
  accountant = dp_accounting.rdp.RdpAccountant()
  accountant.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      m / population, dp_accounting.GaussianDpEvent(2 * z)), 2))
  statement = json.loads((run_dir / 'summary.json').read_text())['privacy']
  assert statement['epsilon']['rdp'] == pytest.approx(accountant.get_epsilon(delta), rel=1e-6)
  # q = m / N, derived from the population: the zero-out row (the same epsilon).
  assert statement['neighboring_relation'] == 'replace_special'
  assert statement['proof'] == claims.claim('independent', 'poisson').proof
  # Its columns' classes are what its factory (the library's reporting base) declares.
  stated = statement['aggregator_measurements']
  assert stated['aggregator/privacy_queries'].startswith('covered: ')
  assert stated['aggregator/zero_updates'].startswith('non-private diagnostic: ')
  assert 'aggregator/zero_updates' in statement['non_private_diagnostics']
  assert TOY in statement['mechanism']
  assert os.path.exists(run_dir / 'plots' / 'epsilon_vs_round.png')


def _documented_mechanism_files() -> dict[str, str]:
  """{file: what it holds} of docs/ARCHITECTURE.md's `mechanism-files` block ("Adding a
  feature"): the files a new mechanism takes."""
  text = (pathlib.Path(REPO) / 'docs' / 'ARCHITECTURE.md').read_text()
  block = re.search(r'```mechanism-files\n(.*?)```', text, re.S).group(1)
  return dict(line.split(None, 1) for line in block.strip().splitlines())


def test_the_documented_files_of_a_mechanism_are_what_each_mechanism_takes():
  """Issue 38.7: the "add a mechanism" list is the module and its registry line, its
  declaration names every field of `Mechanism`, and every built-in mechanism is such a module:
  its MECHANISM, under its own name, in the registry; and nothing else lives beside them."""
  files = _documented_mechanism_files()
  assert list(files) == ['tff_dp/mechanisms/<name>.py', 'tff_dp/mechanisms/__init__.py']
  declared = re.search(r'Mechanism\((.*)\)', files['tff_dp/mechanisms/<name>.py']).group(1)
  assert declared.split(', ') == [f.name for f in dataclasses.fields(mechanisms.Mechanism)]
  modules = {p.stem for p in (pathlib.Path(REPO) / 'tff_dp' / 'mechanisms').glob('*.py')}
  assert modules - {'__init__', 'base'} == set(BUILT_IN)
  for name in BUILT_IN:
    assert importlib.import_module(f'tff_dp.mechanisms.{name}').MECHANISM is (
        mechanisms.MECHANISMS[name])


def test_a_mechanism_declared_with_the_documented_fields_is_a_choice_everywhere(toy_mechanism):
  """The toy mechanism of this file (declared with the documented fields, registered here, no
  package file changed) is a choice of the `dp` setting, of its flag and of the claim table,
  with the claims its noise and samplers give it, and nothing else."""
  assert TOY in mechanisms.DP_KINDS
  assert TOY in config_flags.new_flag_values()['dp'].parser.enum_values
  cfg = config_lib.ExperimentConfig.from_settings(dp=TOY, clip=0.5, noise_multiplier=1.0)
  assert cfg.dp.kind == TOY and cfg.rounds_per_checkpoint == 10   # Independent noise's.
  assert mechanisms.claim(TOY, 'poisson') == claims.claim('independent', 'poisson')
  with pytest.raises(UserInputError, match='has a proof for fixed'):
    mechanisms.claim(TOY, 'fixed_size')   # Proven for `fixed`, but the toy does not list it.


TOY_CORRELATED = 'toy_two_coefficients'
TOY_COEFS = (1.0, 0.5)   # C = lower-triangular Toeplitz: 1 on the diagonal, 0.5 below it.


@pytest.fixture
def toy_correlated_mechanism():
  mechanisms.register(mechanisms.Mechanism(
      name=TOY_CORRELATED, description='two-coefficient Toeplitz noise',
      noise=noise_families.CORRELATED,
      samplers=('min_separation',), extra_arguments=mechanisms.CORRELATED_ARGUMENTS,
      strategy_coefs=lambda rounds, separation, participations, bands, buffers: (TOY_COEFS, {})))
  yield
  del mechanisms.MECHANISMS[TOY_CORRELATED]


def _column_norms(coefs, rounds: int) -> np.ndarray:
  """The column norms of the rounds x rounds lower-triangular Toeplitz matrix of `coefs`."""
  c = np.zeros((rounds, rounds))
  for i in range(rounds):
    for j in range(i + 1):
      c[i, j] = coefs[i - j] if i - j < len(coefs) else 0.0
  return np.linalg.norm(c, axis=0)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_a_correlated_strategy_defined_here_runs_and_is_accounted_from_its_coefficients(
    toy_correlated_mechanism, tag_task, tmp_path):
  """A new strategy is its coefficients: the ledger records them (no named parameters), the
  fresh draws are scaled to the strategy's sensitivity and each round's epsilon follows from
  it; a client participates once in 2 rounds here, so the sensitivity after t rounds is the
  largest column norm of the first t x t block (brute force below)."""
  z, clip, m, delta = 0.9, 0.1, 5, 1e-3
  settings = dict(task='stackoverflow_tag', dp=TOY_CORRELATED, client_sampling='min_separation',
                  clip=clip, noise_multiplier=z, clients_per_round=m, total_rounds=2,
                  rounds_per_eval=2, max_eval_examples=20, delta=delta,
                  root_output_dir=str(tmp_path))
  assert run_stopped_after(settings, tag_task, 'toy').rounds_completed == 2
  run_dir = tmp_path / 'toy'
  records = ledger_lib.read_ledger(str(run_dir / 'ledger.jsonl'))
  assert [r.correlated.coefs for r in records] == [TOY_COEFS] * 2
  assert records[0].correlated.mechanism == TOY_CORRELATED
  sens = [max(_column_norms(TOY_COEFS, t)) for t in (1, 2)]   # 1 and sqrt(1.25)
  stddev = z * clip * sens[-1]
  assert [q.noise_stddev for r in records for q in r.queries] == [pytest.approx(stddev)] * 2
  expected = []
  for t in (1, 2):   # After round t: the Gaussian with multiplier stddev / (clip sens_t).
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(stddev / (clip * sens[t - 1])))
    expected.append(accountant.get_epsilon(delta))
  assert [float(r['epsilon_rdp']) for r in metrics_rows(run_dir)] == pytest.approx(expected)
  assert expected[0] < expected[1]
  statement = json.loads((run_dir / 'summary.json').read_text())['privacy']
  assert statement['neighboring_relation'] == claims.ZERO_OUT
  assert TOY_CORRELATED in statement['mechanism']


def test_each_noise_family_is_declared_once_and_read_by_the_config_and_the_claims():
  """Issue 52, item 2 (in part): what a kind of noise is called, how often a run of it is
  checkpointed and whether a released round may run again are its declaration's
  (`noise_families`), for every mechanism of that noise."""
  assert set(noise_families.FAMILIES) == {c.noise for c in claims.CLAIMS} == {
      m.noise.name for m in mechanisms.MECHANISMS.values()}
  for name, mechanism in mechanisms.MECHANISMS.items():
    family = mechanism.noise
    assert noise_families.get(family.name) is family
    cfg = config_lib.ExperimentConfig.from_settings(
        dp=name, clip=0.1, noise_multiplier=1.0, client_sampling=mechanism.default_sampler,
        **({'min_separation': 2, 'max_participations': 1} if family.planned_for_rounds else {}))
    assert cfg.rounds_per_checkpoint == (1 if family.carries_state else 10)
    if family.carries_state:
      with pytest.raises(UserInputError, match='rerun_released_rounds` cannot apply'):
        config_lib.ExperimentConfig.from_settings(
            dp=name, clip=0.1, noise_multiplier=1.0, client_sampling=mechanism.default_sampler,
            rerun_released_rounds=True, resume=True,
            **({'min_separation': 2, 'max_participations': 1} if family.planned_for_rounds
               else {}))
    unproven = next(s for s in sampling.KINDS if s not in claims.proven_samplers(family.name))
    with pytest.raises(UserInputError, match=re.escape(f'{family.title} has no proof with')):
      claims.claim(family.name, unproven)


def named_mechanisms(source: str, names=BUILT_IN) -> list[tuple[int, str]]:
  """(line, text) of every string constant but a docstring that names a mechanism: as a `dp=`
  value, or by a name that is no English word (a message or help text written by hand)."""
  coined = [n for n in names if n not in ('fixed', 'adaptive', 'joint')]
  pattern = re.compile(r'dp=(' + '|'.join(sorted(names, key=len, reverse=True)) + r')\b'
                       r'|(?<![\w-])(' + '|'.join(coined) + r')(?![\w-])')
  tree = ast.parse(source)
  docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
                and node.body and isinstance(node.body[0], ast.Expr)}
  return [(node.lineno, node.value[:60]) for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)
          and id(node) not in docstrings and pattern.search(node.value)]


def test_the_message_checker_finds_names_written_by_hand():
  source = ('"""About blt."""\nA = "use `dp=fixed`"\nB = "fixed clipping"\nC = f"{x} or bandmf"\n'
            'D = "DP-FTRL"\n')
  assert [line for line, _ in named_mechanisms(source)] == [2, 4]


def test_no_message_outside_mechanisms_names_a_mechanism():
  """Issue 52, item 3: refusals and help texts below the registry named mechanisms by hand
  ("correlated noise (blt, bandmf)", `dp=blt|bandmf`); they now derive them from the registry
  or name the kind of noise."""
  package = pathlib.Path(REPO) / 'tff_dp'
  found = {str(p.relative_to(REPO)): named_mechanisms(p.read_text())
           for p in sorted(package.rglob('*.py'))
           if p.relative_to(package).parts[0] != 'mechanisms'}
  assert {path: hits for path, hits in found.items() if hits} == {}


def test_what_a_factory_takes_from_the_schedule_is_its_noise_familys():
  """Issue 52, item 2: the tree's epoch and a strategy's plan were branches on the noise's
  name in build_privacy and privacy.py, each its own formula (the library API planned
  amplified BandMF for one participation, the command line for ceil(rounds / cycle)); they
  are the family's `schedule` now, read by both. Expected values by hand: a 5-round cycle
  over 12 rounds visits a client at most ceil(12 / 5) = 3 times."""
  assert noise_families.INDEPENDENT.schedule(5, 12, {}) == {}
  assert noise_families.TREE.schedule(5, 12, {}) == {'rounds_per_epoch': 5}
  assert noise_families.CORRELATED.schedule(5, 12, {'bands': 4}, amplified=True) == {
      'rounds': 12, 'min_separation': 5, 'max_participations': 3, 'bands': 4,
      'amplified': True}
  assert noise_families.CORRELATED.schedule(
      5, 12, {'min_separation': 4, 'max_participations': 5})['min_separation'] == 4
  with pytest.raises(UserInputError, match='max_participations=2'):
    noise_families.CORRELATED.schedule(5, 12, {'max_participations': 2})


def test_the_library_api_and_the_command_line_plan_one_schedule():
  ids = [f'c{i}' for i in range(40)]
  private = privacy.PrivateAggregation.build(
      'bandmf', ids, clients_per_round=10, clip=1.0, noise_multiplier=1.0, delta=1e-5,
      rounds=10, sampling_kind='cyclic_poisson', bands=4, sampling_probability=0.25)
  cfg = config_lib.ExperimentConfig.from_settings(
      dp='bandmf', clip=1.0, noise_multiplier=1.0, client_sampling='cyclic_poisson', bands=4,
      clients_per_round=10, total_rounds=10)
  factory = build_privacy.build_aggregator(cfg.dp, 10, 4, 10, amplified=True,
                                           mechanism_settings=cfg.mechanism_settings())
  # Four groups over 10 rounds: every 4 rounds, at most ceil(10 / 4) = 3 times.
  assert (private.aggregator.strategy.min_separation,
          private.aggregator.strategy.max_participations) == (4, 3)
  assert private.aggregator.strategy == factory.strategy


def test_no_module_outside_the_families_compares_a_noise_familys_name():
  """What differs between kinds of noise is the family's declaration: no module branches on
  its name. The accounting CLI's and the planner's modes share two of its words."""
  names = set(noise_families.FAMILIES)
  package = pathlib.Path(REPO) / 'tff_dp'
  found = {str(p.relative_to(REPO)): [name for _, name in name_compares(p.read_text(), names)]
           for p in sorted(package.rglob('*.py'))}
  assert {path: hits for path, hits in found.items() if hits} == {
      'tff_dp/accounting/__main__.py': ['tree'],        # --mechanism=tree (calibration mode)
      'tff_dp/accounting/calibration.py': ['tree'],     # calibrate_noise_multiplier's mode
      'tff_dp/accounting/planner.py': ['correlated'],   # the planner's curve
      'tff_dp/ledger/records.py': ['correlated'],       # the record's JSON key
  }
