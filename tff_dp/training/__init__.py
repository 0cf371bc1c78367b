"""Iterative-process builders, the round loop and the run directory (library side of the CLI)."""
