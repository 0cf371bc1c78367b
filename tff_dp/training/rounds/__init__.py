"""The round loop and the hooks that act in each round (evaluation, checkpoint aggregates,
correlated-noise feed, canaries)."""
