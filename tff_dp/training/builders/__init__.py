"""The parts of an experiment built from its config: the learning process (FedAvg, optimizers,
AdaDPS), the privacy part (sampler, DP aggregator, recorder), the evaluation, the client datasets,
and `components`, what the round loop takes and returns."""
