"""The three classes of a run's outputs, and the facts of a run its classification depends on.

* COVERED: an output of the DP mechanism or post-processing of such outputs (and of public
  data): the user-level guarantee the ledger states covers it, and it may be published.
* SECRET: something the operator must keep (noise state of correlated-noise mechanisms, keys and
  seeds that reproduce the samples, the canary key, the holdout key): publishing it voids the
  guarantee, or the amplification it relies on.
* DIAGNOSTIC: depends on client data without noise (sampled and rejected client counts, client
  training metrics, timings, evaluation on the protected users' own data): a non-private
  diagnostic for the operator.
"""

import dataclasses

from tff_dp import measurements as measurements_lib

COVERED = 'covered'
SECRET = 'secret'
DIAGNOSTIC = 'diagnostic'
CLASSES = (COVERED, SECRET, DIAGNOSTIC)


@dataclasses.dataclass(frozen=True)
class RunFacts:
  """What a run's classification depends on.

  dp: the run trains with DP (without, nothing is covered: there is no guarantee).
  noise_state_in_checkpoints: checkpoints hold the mechanism's noise state (the noise feed's
    seed of `ftrl`, `ftrl_adaptive`, BLT and BandMF, their buffers or tree nodes in snapshots;
    `ftrl_adaptive`'s clipped-count tree), so a checkpoint and the released models together
    reveal the clipped sums.
  eval_covered: evaluation data is disjoint from the protected population or declared public.
  seeded: a sampling seed reproduces the samples (config.json records it).
  private_release: the run keeps diagnostics out of metrics.csv, TensorBoard and the console.
  measurements: what the run's model aggregator declares it reports (`tff_dp.measurements`):
    the coverage of its `aggregator/...` columns.
  """
  dp: bool = True
  noise_state_in_checkpoints: bool = False
  eval_covered: bool = False
  seeded: bool = False
  private_release: bool = False
  measurements: tuple[measurements_lib.Measurement, ...] = ()
