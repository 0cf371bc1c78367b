"""`SamplerKind`: a client sampler as the rest of the package reads it, declared by the
sampler's own module (`tff_dp/sampling/<name>.py`) and found through the registry
(`tff_dp.sampling.KINDS`), so that no other module needs to know a sampler by its name.

A declaration says how to build the sampler (`build`, from one `SamplerRequest`), what its
schedule needs (a secret key kept for resume, a number of groups, a rate q), how a production
run of another population and cohort would sample (`production_event`, the noise cohort's
projection) and what the privacy statement says it is accounted as (`statement`). Which
relation each (noise, sampler) pair is proven under is the claim table's
(`tff_dp.accounting.claims`); the ledger's event shapes are the ledger format's
(`tff_dp.ledger.records`).
"""

import dataclasses
from typing import Any, Callable, Hashable, Optional, Sequence

from tff_dp import ledger


@dataclasses.dataclass(frozen=True)
class SamplerRequest:
  """What a sampler is built from.

  client_ids: the population (each id once). clients_per_round: the sample size, or its
  expected value for the kinds with a rate. seed: reproducible draws (None: secret ones from
  the OS). key: a keyed schedule's secret (None: a new one, unless `seed` is given).
  groups: the number of groups of a grouped kind. probability: the rate q of a kind with a
  rate; probability_given: whether q was fixed before the data was seen (the add/remove
  claim) or derived from this population (zero-out)."""
  client_ids: Sequence[Hashable]
  clients_per_round: int
  seed: Optional[int] = None
  key: Optional[bytes] = None
  groups: Optional[int] = None
  probability: Optional[float] = None
  probability_given: bool = False


@dataclasses.dataclass(frozen=True)
class SamplerKind:
  """A sampler's declaration.

  name: its `client_sampling` choice (and the ledger event's `kind`). title: how sentences
  name it ('Poisson', as in 'Poisson sampling'). description: what the choice means (its
  flag's help). build: `SamplerRequest` -> the sampler.
  with_rate: it includes each client with a rate q (`sampling_probability`, or derived from
  the population). keyed: its schedule is a secret key's over epochs (or cycles) that its
  events record, the key kept under the run's secret/ folder so that a resumed run continues
  it. grouped: it needs a number of groups (`groups`).
  production_event: (the run's event, production population N, production cohort M, round)
  -> the event of a production run sampling M of N the same way (`NoiseCohort`).
  statement: an event -> the privacy statement's fields for it (`accounted_as` and the
  sample size or rate). production_noise: (a round's correlated noise, the production run's
  rounds between a client's participations) -> the noise a production run would record,
  for a kind whose schedule follows the population (None: the same noise).
  independent_event: (the sample, a neighbouring relation, the dp_accounting event of the
  round's Gaussian noise) -> the round's dp_accounting event, for a kind independent noise is
  proven with (the claim table); UserInputError under a relation it has no analysis for."""
  name: str
  title: str
  description: str
  build: Callable[[SamplerRequest], Any]
  production_event: Callable[[ledger.SamplingEvent, int, int, int], ledger.SamplingEvent]
  statement: Callable[[ledger.SamplingEvent], dict]
  with_rate: bool = False
  keyed: bool = False
  grouped: bool = False
  production_noise: Optional[Callable[[ledger.CorrelatedNoise, int],
                                      ledger.CorrelatedNoise]] = None
  independent_event: Optional[Callable[[ledger.SamplingEvent, str, Any], Any]] = None
