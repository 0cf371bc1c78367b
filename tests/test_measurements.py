"""Coverage declared where a measurement is made (issue 38, item 2): every factory declares the
measurements its process reports, with their meaning and whether the guarantee covers them;
a process reporting an undeclared one is refused where it is built. Oracles: the measurements
a process actually returns from a round (not its type), and the classes the issue on what a
release covers assigns them (noised or released values covered; client counts not)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_dp import errors
from tff_dp import measurements
from tff_dp import mechanisms
from tff_dp.aggregators import noise_feed
from tff_dp.aggregators import non_finite
from tff_dp.aggregators import preconditioned
from tff_dp.aggregators import reporting

SHAPES = [(3,), (2, 2)]
VALUE_TYPE = tff.to_type([(np.float32, list(s)) for s in SHAPES])
EXTRA = {'ftrl': dict(rounds_per_epoch=4), 'ftrl_adaptive': dict(rounds_per_epoch=4),
         'blt': dict(rounds=6, min_separation=2, max_participations=3),
         'bandmf': dict(rounds=6, min_separation=2, max_participations=3, bands=2)}
# Keys whose values hold no client data without noise (the classes).
COVERED_KEYS = {'privacy_queries', 'dp_query_metrics', 'clip', 'next_clip',
                'unclipped_fraction_estimate', 'scale', 'next_scale', 'tree_aggregation'}


def _reported_paths(value, path=()):
  """Key paths to the values of a round's measurements, as they came back."""
  if isinstance(value, collections.abc.Mapping):
    for key, inner in value.items():
      yield from _reported_paths(inner, path + (str(key),))
  elif isinstance(value, (list, tuple)) and not hasattr(value, 'shape'):
    for index, inner in enumerate(value):
      yield from _reported_paths(inner, path + (str(index),))
  else:
    yield path


def _one_round(factory, feed):
  process = factory.create(VALUE_TYPE)
  clients = [[np.full(s, c, np.float32) for s in SHAPES] for c in (1.0, np.nan)]
  state = process.initialize()
  return process, process.next(feed.into(state, 1) if feed else state, clients).measurements


@pytest.mark.parametrize('kind', sorted(mechanisms.MECHANISMS))
def test_every_mechanism_declares_each_measurement_its_process_reports(kind):
  inner = mechanisms.build_aggregator(kind, noise_multiplier=1.0, clients_per_round=2.0,
                                      clip=1.0, **EXTRA.get(kind, {}))
  scales = [np.full(s, 2.0, np.float32) for s in SHAPES]
  factory = non_finite.NonFiniteZeroingFactory(preconditioned.PreconditionedFactory(scales, inner))
  feed = noise_feed.for_factory(inner)   # Correlated noise.
  process, reported = _one_round(factory, feed)
  declared = measurements.declared(factory)
  paths = list(_reported_paths(reported))
  assert paths
  for path in paths:
    expected = path[0] == 'preconditioned' and path[1] in COVERED_KEYS
    assert measurements.is_covered(declared, path) == expected, path
  assert {p[0] for p in paths} == {'non_finite_zeroed', 'zero_updates', 'preconditioned'}
  reporting.check_declared(factory, process.next.type_signature.result.measurements.member)


class _ReportsNorms(tff.aggregators.UnweightedAggregationFactory):
  """Wraps a DP factory and adds the clients' largest update norm, without noise, under
  'norms/clip': what the old name rule covered (a path part named 'clip') and must not be."""

  def __init__(self, inner, declare: bool):
    self._inner, self._declare = inner, declare

  def measurements(self):
    own = (measurements.Measurement('norms', 'the largest client norm, without noise'),)
    wrapped = measurements.Measurement('inner', 'the DP factory\'s',
                                       inner=measurements.declared(self._inner))
    return (own if self._declare else ()) + (wrapped,)

  def create(self, value_type):
    inner = self._inner.create(value_type)

    @tff.tensorflow.computation(value_type)
    def norm(value):
      return tf.linalg.global_norm(tf.nest.flatten(value))

    @tff.federated_computation(inner.initialize.type_signature.result,
                               tff.FederatedType(value_type, tff.CLIENTS))
    def next_fn(state, value):
      output = inner.next(state, value)
      largest = tff.federated_max(tff.federated_map(norm, value))
      added = tff.federated_zip(collections.OrderedDict(
          norms=collections.OrderedDict(clip=largest), inner=output.measurements))
      return tff.templates.MeasuredProcessOutput(output.state, output.result, added)

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def test_a_process_reporting_an_undeclared_measurement_is_refused():
  dp = mechanisms.build_aggregator('fixed', noise_multiplier=1.0, clients_per_round=2.0,
                                   clip=1.0)
  undeclared = _ReportsNorms(dp, declare=False)
  reported = undeclared.create(VALUE_TYPE).next.type_signature.result.measurements.member
  with pytest.raises(errors.RunFailedError, match=r'declares: norms/clip \('):
    reporting.check_declared(undeclared, reported)
  declared = _ReportsNorms(dp, declare=True)
  reporting.check_declared(declared, reported)
  assert not measurements.is_covered(measurements.declared(declared), ('norms', 'clip'))


def test_nested_declarations_and_lookup():
  inner = (measurements.Measurement('q', 'noised', covered=True),
           measurements.Measurement('n', 'a count'))
  declared = (measurements.Measurement('wrap', 'inner', inner=inner),
              measurements.Measurement('top', 'a count'))
  assert measurements.is_covered(declared, ('wrap', 'q', 'update', 'l2_norm_clip'))
  assert not measurements.is_covered(declared, ('wrap', 'n'))
  assert not measurements.is_covered(declared, ('top',))
  for undeclared in (('wrap',), ('wrap', 'x'), ('q',), ()):
    with pytest.raises(KeyError, match='not declared'):
      measurements.is_covered(declared, undeclared)
  assert [(m.key, m.covered) for m in measurements.flattened(declared)] == [
      ('wrap/q', True), ('wrap/n', False), ('top', False)]
