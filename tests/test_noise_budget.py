"""Pure-Python tests of the noise-split formulas and the privacy_queries reader."""

import collections
import math

import numpy as np
import pytest

from tff_dp import noise_budget
from tff_dp.aggregators import privacy_queries
from tff_dp.errors import UserInputError


def test_update_noise_multiplier_matches_tff_formula():
  z, sigma_b = 1.0, 1.0  # TFF: (1 - (2)^-2)^-1/2 = 1.1547.
  assert noise_budget.update_noise_multiplier(z, sigma_b) == pytest.approx(1 / math.sqrt(0.75))
  # By hand: 0.7^-2 = 2.0408, (2 * 0.5)^-2 = 1: z_v = 1.0408^-1/2 = 0.98020.
  assert noise_budget.update_noise_multiplier(0.7, 0.5) == pytest.approx(0.98020, abs=1e-5)


def test_update_noise_multiplier_with_several_count_queries():
  # By hand: 0.5^-2 = 4, five counts at (2 * 2)^-2 = 1/16 each: z_v = (4 - 5/16)^-1/2.
  assert noise_budget.update_noise_multiplier(0.5, 2.0, 5) == pytest.approx(
      (4 - 5 / 16) ** -0.5, rel=1e-12)
  assert noise_budget.update_noise_multiplier(0.0, 1.0, 5) == 0.0


@pytest.mark.parametrize('z,sigma_b,k', [(2.0, 1.0, 1), (3.0, 1.0, 1), (1.0, 1.0, 4),
                                         (1.0, 0.0, 1)])
def test_impossible_split_says_what_to_change(z, sigma_b, k):
  with pytest.raises(UserInputError) as e:
    noise_budget.update_noise_multiplier(z, sigma_b, k)
  msg = str(e.value)
  assert '`clipped_count_stddev` above' in msg and 'lower `noise_multiplier`' in msg
  assert '--' not in msg   # A library error names parameters, not command-line flags.
  assert f'{z * math.sqrt(k) / 2:g}' in msg


def test_default_clipped_count_stddev_is_m_over_20_and_at_least_z():
  assert noise_budget.default_clipped_count_stddev(100) == 5.0
  assert noise_budget.default_clipped_count_stddev(100, 0.7) == 5.0
  assert noise_budget.default_clipped_count_stddev(5, 0.7) == 0.7   # m / 20 = 0.25 < z.
  assert noise_budget.resolve_clipped_count_stddev(None, 40) == 2.0
  assert noise_budget.resolve_clipped_count_stddev(3, 40) == 3.0
  with pytest.raises(UserInputError):
    noise_budget.resolve_clipped_count_stddev(-1.0, 40)


def test_proportional_allocation():
  zs = noise_budget.group_noise_multipliers(0.8, [10, 1000, 5], 'proportional')
  assert zs == pytest.approx([0.8 * math.sqrt(3)] * 3)
  assert noise_budget.effective_noise_multiplier(zs) == pytest.approx(0.8)


def test_dimensionality_allocation():
  sizes = [10, 1000, 5]
  zs = noise_budget.group_noise_multipliers(0.8, sizes, 'dimensionality')
  assert zs == pytest.approx([0.8 * math.sqrt(1015 / d) for d in sizes])
  assert noise_budget.effective_noise_multiplier(zs) == pytest.approx(0.8)
  # sigma_g = z sqrt(D/d_g) S_g: the per-coordinate noise is equal relative to S_g/sqrt(d_g).
  with pytest.raises(UserInputError):
    noise_budget.group_noise_multipliers(0.8, sizes, 'bogus')


def test_effective_noise_multiplier_eq1():
  # (sigma_g / S_g) = 2 and 2 -> combined 2 / sqrt(2).
  assert noise_budget.effective_noise_multiplier([2.0, 2.0]) == pytest.approx(math.sqrt(2))
  assert noise_budget.effective_noise_multiplier([1.0, 0.0]) == 0.0


def test_find_privacy_queries_nested_and_prefixed():
  q = lambda c, s: collections.OrderedDict(l2_norm_clip=np.float32(c), noise_stddev=np.float32(s))
  metrics = collections.OrderedDict(
      loss=1.0,
      aggregator=collections.OrderedDict(
          privacy_queries=collections.OrderedDict(update=q(0.5, 0.25)),
          preconditioned=collections.OrderedDict(
              privacy_queries=collections.OrderedDict(clipped_count=q(0.5, 2.0)))))
  found = privacy_queries.find_privacy_queries(metrics)
  assert [(x.name, x.l2_norm_clip, x.noise_stddev) for x in found] == [
      ('aggregator/update', 0.5, 0.25), ('aggregator/preconditioned/clipped_count', 0.5, 2.0)]
  assert all(type(x.l2_norm_clip) is float for x in found)
  top = privacy_queries.find_privacy_queries(metrics['aggregator'])
  assert [x.name for x in top] == ['update', 'preconditioned/clipped_count']
  assert privacy_queries.find_privacy_queries({'a': 1}) == []


def test_the_accountant_and_calibration_use_the_aggregators_formulas():
  # One home: what the aggregators build with is what the accountant and calibration compute.
  from tff_dp import accounting  # pylint: disable=g-import-not-at-top
  from tff_dp.accounting import calibration  # pylint: disable=g-import-not-at-top
  assert accounting.effective_noise_multiplier([2.0, 2.0]) == pytest.approx(math.sqrt(2))
  # Zero noise means no privacy in both (they used to disagree: 0 here, an exception there).
  assert accounting.effective_noise_multiplier([1.0, 0.0]) == 0.0
  assert calibration.update_noise_multiplier(0.0, 1.0) == 0.0
  assert calibration.update_noise_multiplier(1.0, 1.0) == pytest.approx((1 - 0.25)**-0.5)
  assert calibration.update_noise_multiplier(1.0, None) == 1.0
  with pytest.raises(UserInputError, match='clipped_count_stddev` above 0.5'):
    calibration.update_noise_multiplier(1.0, 0.5)
  with pytest.raises(UserInputError, match='clipped_count_stddev'):
    calibration.update_noise_multiplier(1.0, float('nan'))
