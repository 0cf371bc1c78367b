"""A run of an experiment, the library side of the CLI, in layers that import downward only.

Here: the config a user writes (`config`, `config_sections`, `config_flags`, the task registry
and protocol, `preflight`'s refusals) and the entry points built on the rest (`experiment`,
`session`, `api`). Below them, by job:
  rounds/     the round loop and the hooks that act in each round;
  report/     what a run reports: console lines, the final report, statement, plots, release;
  builders/   the learning process, the privacy part and the evaluation, from a config;
  run_state/  what a run keeps: its directory, checkpoints, resume, the privacy recorder, the
              stop signal and the round hooks' protocol.
"""
