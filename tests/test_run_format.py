"""The run directory's format (issue 26): every metrics column declared once with its meaning,
unit, role and class; readers find columns by role. Oracles: literal column names as runs write
them (a real run's header is walked in test_release.py) and the classes the issue on what a
release covers assigns them."""

import pytest

from tff_dp import measurements
from tff_dp import mechanisms
from tff_dp.aggregators import non_finite
from tff_dp.run_format import classes
from tff_dp.run_format import columns

# What the model aggregator of the run below declares (adaptive clipping, NaN/Inf zeroing).
ADAPTIVE = measurements.declared(non_finite.NonFiniteZeroingFactory(mechanisms.build_aggregator(
    'adaptive', noise_multiplier=1.0, clients_per_round=10.0, clip=0.1)))
DP = classes.RunFacts(measurements=ADAPTIVE)
DP_EVAL_COVERED = classes.RunFacts(eval_covered=True, measurements=ADAPTIVE)
NO_DP = classes.RunFacts(dp=False, measurements=ADAPTIVE)

# The header of a DP-FedAvg run with adaptive clipping, EMA and past-k, and canaries.
HEADER = ('round,num_clients,round_seconds,train_loss,train_accuracy,'
          'aggregator/non_finite_zeroed,aggregator/zero_updates,'
          'aggregator/privacy_queries/update/l2_norm_clip,'
          'aggregator/privacy_queries/update/noise_stddev,'
          'aggregator/privacy_queries/clipped_count/l2_norm_clip,'
          'aggregator/privacy_queries/clipped_count/noise_stddev,aggregator/clip,'
          'aggregator/next_clip,aggregator/unclipped_fraction_estimate,'
          'aggregator/dp_query_metrics/clip,epsilon_rdp,epsilon_pld,wall_seconds,eval_loss,'
          'eval_accuracy,eval_ema_accuracy,eval_past_k_accuracy,canary_epsilon_final_model,'
          'canary_epsilon_all_iterates,canary_seconds,clients_rejected,trained_from_aggregate'
          ).split(',')
DIAGNOSTIC = {'num_clients', 'round_seconds', 'train_loss', 'train_accuracy',
              'aggregator/non_finite_zeroed', 'aggregator/zero_updates', 'wall_seconds',
              'canary_seconds', 'clients_rejected'}
EVAL = {'eval_loss', 'eval_accuracy', 'eval_ema_accuracy', 'eval_past_k_accuracy'}


def test_every_column_a_run_writes_is_declared_with_meaning_and_unit():
  for name in HEADER:
    declared = columns.column(name)
    assert declared.meaning and declared.unit, name


@pytest.mark.parametrize('facts', [DP, DP_EVAL_COVERED, NO_DP])
def test_classes_of_the_columns(facts):
  for name in HEADER:
    if not facts.dp or name in DIAGNOSTIC or (name in EVAL and not facts.eval_covered):
      expected = classes.DIAGNOSTIC
    else:
      expected = classes.COVERED
    assert columns.coverage(name, facts) == expected, name


def test_an_undeclared_column_is_refused():
  with pytest.raises(KeyError, match='not declared'):
    columns.coverage('my_new_metric', DP)


def test_readers_find_columns_by_role():
  assert columns.names_with_role(HEADER, columns.CLIP) == [
      'aggregator/privacy_queries/update/l2_norm_clip']
  # Per-layer clips, and an epsilon header in another order: the accountants' order.
  per_layer = ['epsilon_pld', 'aggregator/privacy_queries/update/0/l2_norm_clip',
               'aggregator/privacy_queries/update/1/l2_norm_clip', 'epsilon_rdp']
  assert columns.names_with_role(per_layer, columns.CLIP) == per_layer[1:3]
  assert columns.names_with_role(per_layer, columns.EPSILON) == ['epsilon_rdp', 'epsilon_pld']
  assert columns.names_with_role(HEADER, columns.CANARY_EPSILON) == [
      'canary_epsilon_final_model', 'canary_epsilon_all_iterates']
  assert set(columns.names_with_role(HEADER, columns.EVAL)) == EVAL
  # A clip norm outside the privacy queries is still a clip; its factory says if it is covered.
  assert columns.names_with_role(['aggregator/g0/l2_norm_clip'], columns.CLIP)
  g0 = classes.RunFacts(measurements=(measurements.Measurement('g0', 'a clip, not noised'),))
  assert columns.coverage('aggregator/g0/l2_norm_clip', g0) == classes.DIAGNOSTIC


def test_an_aggregator_column_is_covered_as_its_factory_declares_not_by_its_name():
  """The old rule covered any aggregator path with a part named like a released value ('clip',
  'scale', ...): a factory's raw client norm under 'norms/clip' was released as covered."""
  norms = measurements.Measurement('norms', 'the largest client norm, without noise')
  facts = classes.RunFacts(measurements=ADAPTIVE + (norms,))
  assert columns.coverage('aggregator/norms/clip', facts) == classes.DIAGNOSTIC
  with pytest.raises(KeyError, match='not declared'):   # Nobody's measurement: refused.
    columns.coverage('aggregator/scale/tensor_0', DP)
