"""The kinds of noise a mechanism adds, collected: `INDEPENDENT`, `TREE` and `CORRELATED`, each
declared beside its account (`gaussian_rounds`, `tree_rounds`, `correlated_rounds`), and the
families a user `register`s (`noise_family.NoiseFamily`).

A mechanism names its family (`tff_dp.mechanisms.Mechanism.noise` is the family itself); its
proven samplers are the claim table's rows for the family's name (`claims`); its ledger
records are composed by the family's account (`of_record`).
"""

from tff_dp import ledger
from tff_dp.accounting import claims
from tff_dp.accounting import correlated_rounds
from tff_dp.accounting import gaussian_rounds
from tff_dp.accounting import noise_family
from tff_dp.accounting import tree_rounds

NoiseFamily = noise_family.NoiseFamily
INDEPENDENT = gaussian_rounds.FAMILY
TREE = tree_rounds.FAMILY
CORRELATED = correlated_rounds.FAMILY
FAMILIES = noise_family.FAMILIES   # name -> family, the built-in ones and those registered.
register = noise_family.register
get = noise_family.get


def of_record(record: ledger.RoundRecord) -> NoiseFamily:
  """The family of a ledger record: the one it names, or the built-in one its shape tells
  (`claims.noise_of_record`)."""
  return get(claims.noise_of_record(record))
