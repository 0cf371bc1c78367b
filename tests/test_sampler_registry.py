"""A sampler is one module too (issue 52, item 1): each declares itself (`SamplerKind`), the
package reads the declarations (no module outside tff_dp/sampling/ compares a sampler's name),
the ledger's event shapes are the declarations', and a sampler declared in this file is a
choice of `client_sampling`, recorded by the ledger and refused without a proof."""

import ast
import dataclasses
import importlib
import pathlib
import re

import pytest

from run_helpers import REPO
from test_mechanisms import name_compares
from test_mechanisms import name_tables
from tff_dp import ledger as ledger_lib
from tff_dp import mechanisms
from tff_dp import sampling
from tff_dp.errors import UserInputError

BUILT_IN = frozenset(sampling.KINDS)

# Where a sampler's name may stand outside tff_dp/sampling/: a mechanism's declaration of the
# samplers it takes, and the ledger format's shapes of the built-in kinds (read without the
# samplers imported).
_DECLARING = ('tff_dp/mechanisms/', 'tff_dp/ledger/sampling_events.py')


def _schedule_statements(source: str) -> list[tuple[int, int]]:
  """Line ranges of statements naming `max_participations`: there `min_separation` is the
  correlated schedule's parameter (which shares the sampler's name), not the sampler."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.stmt) and any(
        isinstance(c, ast.Constant) and c.value == 'max_participations'
        for c in ast.walk(node)):
      found.append((node.lineno, node.end_lineno))
  return found


def sampler_names(source: str) -> list[tuple[int, str]]:
  """(line, name) of every comparison with a sampler's name, and every literal list or table
  holding one, but the schedule's `min_separation`."""
  spans = _schedule_statements(source)
  hits = name_compares(source, BUILT_IN) + name_tables(source, BUILT_IN)
  return sorted({(line, name) for line, name in hits if not (
      name == 'min_separation' and any(a <= line <= b for a, b in spans))})


def test_the_checker_tells_the_sampler_from_the_schedule():
  source = ("a = kind == 'poisson'\nb = kind in ('shuffled', 'x')\n"
            "for n in ('min_separation', 'max_participations'):\n  pass\n"
            "c = kind != 'min_separation'\n")
  assert sampler_names(source) == [(1, 'poisson'), (2, 'shuffled'), (5, 'min_separation')]


def test_no_module_outside_sampling_compares_or_lists_a_sampler_name():
  package = pathlib.Path(REPO) / 'tff_dp'
  found = {}
  for path in sorted(package.rglob('*.py')):
    relative = str(path.relative_to(REPO))
    if relative.startswith(('tff_dp/sampling/',) + _DECLARING):
      continue
    hits = sampler_names(path.read_text())
    if hits:
      found[relative] = hits
  assert found == {}
  assert len(list(package.rglob('*.py'))) > 100   # The walk saw the package.
  # The declaring places only list; none compares.
  for path in sorted(package.rglob('*.py')):
    if str(path.relative_to(REPO)).startswith(_DECLARING):
      assert name_compares(path.read_text(), BUILT_IN) == [], path


def test_each_ledger_shape_is_its_samplers_declaration():
  for name, kind in sampling.KINDS.items():
    event_fields = ledger_lib.EventShape(probability=kind.with_rate, epoch=kind.keyed,
                                         groups=kind.grouped)
    assert ledger_lib.SAMPLING_KINDS and name in ledger_lib.SAMPLING_KINDS
    with pytest.raises(ValueError, match='already registered'):
      sampling.register(kind)
    ledger_lib.register_sampling_kind(name, event_fields)   # The same shape: accepted.
    with pytest.raises(ValueError, match='recorded with'):
      ledger_lib.register_sampling_kind(name, ledger_lib.EventShape(
          probability=not kind.with_rate, epoch=kind.keyed, groups=kind.grouped))


TOY = 'toy_first_m'


class _FirstM(sampling.Sampler):
  """The first m clients every round (deterministic: no amplification, no proof)."""

  def __init__(self, ids, m):
    super().__init__(ids, seed=0)
    self.m = m

  def _draw(self, randomness, round_num):
    del randomness, round_num
    return list(range(self.m))

  def sampling_event(self, round_num=None):
    del round_num
    return ledger_lib.SamplingEvent(TOY, len(self.client_ids), sample_size=self.m, seeded=True)


@pytest.fixture
def toy_sampler():
  sampling.register(sampling.SamplerKind(
      name=TOY, title='first-m', description='the first clients_per_round clients',
      build=lambda request: _FirstM(request.client_ids, request.clients_per_round),
      production_event=lambda event, n, m, r: ledger_lib.SamplingEvent(TOY, n, sample_size=m),
      statement=lambda event: {'sample_size': event.sample_size, 'accounted_as': 'nothing'}))
  yield
  del sampling.KINDS[TOY]


def test_a_sampler_declared_here_plugs_in_and_is_refused_without_a_proof(toy_sampler, tmp_path):
  from tff_dp.training.config import ExperimentConfig  # pylint: disable=g-import-not-at-top
  assert TOY in sampling.CHOICES and TOY in mechanisms.SAMPLER_CHOICES
  assert mechanisms.SAMPLER_CHOICES[TOY] == 'the first clients_per_round clients'
  sampler = sampling.build_sampler(TOY, ['a', 'b', 'c', 'd'], 2)
  assert sampler.sample(1) == ['a', 'b'] == sampler.sample(7)
  # The ledger records its events and reads them back.
  record = ledger_lib.RoundRecord(1, sampler.sampling_event(1), ())
  with ledger_lib.PrivacyLedger(str(tmp_path / 'ledger.jsonl')) as led:
    led.append(record)
  assert ledger_lib.read_ledger(str(tmp_path / 'ledger.jsonl')) == [record]
  # A non-private run may use it; a mechanism has no proof with it, named by its title.
  assert ExperimentConfig.from_settings(dp='none', client_sampling=TOY).sampling.client_sampling \
      == TOY
  with pytest.raises(UserInputError, match=f'no proof with {TOY} sampling'):
    ExperimentConfig.from_settings(dp='fixed', clip=0.1, noise_multiplier=1.0,
                                   client_sampling=TOY)
  with pytest.raises(UserInputError, match=f'rate of poisson or cyclic_poisson sampling; '
                                           f'`client_sampling={TOY}` draws'):
    ExperimentConfig.from_settings(dp='fixed', clip=0.1, noise_multiplier=1.0,
                                   client_sampling=TOY, sampling_probability=0.5)


def _documented_sampler_files() -> dict[str, str]:
  """{file: what it holds} of docs/ARCHITECTURE.md's `sampler-files` block."""
  text = (pathlib.Path(REPO) / 'docs' / 'ARCHITECTURE.md').read_text()
  block = re.search(r'```sampler-files\n(.*?)```', text, re.S).group(1)
  return dict(line.split(None, 1) for line in block.strip().splitlines())


def test_the_documented_files_of_a_sampler_are_what_each_sampler_takes():
  """The "add a sampler" recipe is the module and its registry line, its declaration names
  every field of `SamplerKind`, and every built-in sampler is such a module: its KIND, under
  its own name, in the registry."""
  files = _documented_sampler_files()
  assert list(files) == ['tff_dp/sampling/<name>.py', 'tff_dp/sampling/__init__.py']
  declared = re.search(r'SamplerKind\((.*)\)', files['tff_dp/sampling/<name>.py']).group(1)
  assert declared.split(', ') == [f.name for f in dataclasses.fields(sampling.SamplerKind)]
  for name in BUILT_IN:
    assert importlib.import_module(f'tff_dp.sampling.{name}').KIND is sampling.KINDS[name]


def test_a_sampler_declared_here_is_a_choice_of_the_flag(toy_sampler):
  from tff_dp.training import config_flags  # pylint: disable=g-import-not-at-top
  assert TOY in config_flags.new_flag_values()['client_sampling'].parser.enum_values


PROVEN_TOY, PROVEN_TOY_MECHANISM = 'toy_bernoulli', 'toy_fixed_bernoulli'


class _Bernoulli(sampling.PoissonSampler):
  """Poisson sampling under another name: a sampler with a proof, declared here."""

  def sampling_event(self, round_num=None):
    return dataclasses.replace(super().sampling_event(round_num), kind=PROVEN_TOY)


@pytest.fixture
def proven_toy_sampler(monkeypatch):
  """The sampler, the claim row its proof gives with independent noise and a mechanism that
  takes it, registered as a user would (the registries restored afterwards)."""
  from tff_dp.accounting import claims  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(claims, 'CLAIMS', list(claims.CLAIMS))
  monkeypatch.setattr(claims, '_BY_ROW', dict(claims._BY_ROW))  # pylint: disable=protected-access
  poisson = sampling.KINDS['poisson']
  sampling.register(dataclasses.replace(
      poisson, name=PROVEN_TOY, title='Bernoulli', description='Poisson, renamed',
      build=lambda r: _Bernoulli(r.client_ids, r.probability, seed=r.seed,
                                 probability_given=r.probability_given)))
  claims.register(claims.Claim(
      claims.INDEPENDENT_NOISE, PROVEN_TOY, 'add_remove', 'the Poisson-subsampled Gaussian',
      amplified=True, attack='test_a_sampler_with_a_proof_plugs_in', rate=claims.RATE_GIVEN))
  mechanisms.register(mechanisms.Mechanism(
      name=PROVEN_TOY_MECHANISM, description='fixed clip, Bernoulli sampling',
      noise=mechanisms.get('fixed').noise, samplers=(PROVEN_TOY,),
      build_factory=mechanisms.get('fixed').build_factory))
  yield
  del mechanisms.MECHANISMS[PROVEN_TOY_MECHANISM]
  del sampling.KINDS[PROVEN_TOY]


def test_a_sampler_with_a_proof_plugs_in(proven_toy_sampler, tmp_path):
  """Its claim row is registered, not written into the claim table: a mechanism listing it is
  a `dp` choice with it, records its events and is accounted as its declaration says (here
  as Poisson: dp_accounting's epsilon of five Poisson-sampled Gaussians)."""
  import dp_accounting  # pylint: disable=g-import-not-at-top
  from tff_dp import privacy  # pylint: disable=g-import-not-at-top
  from tff_dp.training.config import ExperimentConfig  # pylint: disable=g-import-not-at-top
  cfg = ExperimentConfig.from_settings(dp=PROVEN_TOY_MECHANISM, clip=1.0, noise_multiplier=1.0,
                                       client_sampling=PROVEN_TOY, sampling_probability=0.1)
  assert cfg.sampling.client_sampling == PROVEN_TOY
  path = str(tmp_path / 'ledger.jsonl')
  private = privacy.PrivateAggregation.build(
      PROVEN_TOY_MECHANISM, [f'c{i}' for i in range(100)], clients_per_round=10, clip=1.0,
      noise_multiplier=1.2, delta=1e-5, sampling_kind=PROVEN_TOY, sampling_probability=0.1,
      ledger_path=path)
  metrics = {'privacy_queries': {'update': {'l2_norm_clip': 1.0, 'noise_stddev': 1.2}}}
  for r in range(1, 6):
    private.record(r, metrics)
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.2)), 5)
  assert private.statement()['epsilon']['rdp'] == pytest.approx(acc.get_epsilon(1e-5),
                                                                 rel=1e-9)
  assert [r.sampling.kind for r in ledger_lib.read_ledger(path)] == [PROVEN_TOY] * 5
