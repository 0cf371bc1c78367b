"""What a run keeps between rounds and across restarts: its directory, checkpoints, resume, the
privacy recorder (each round's ledger record), the stop signal and the round hooks' protocol."""
