"""Python's garbage-collector thresholds for a program that runs TFF (`use_for_a_program()`).

With TensorFlow and TFF imported, a process holds about a million objects the collector tracks,
and building a learning process (Keras models, autograph, TFF's tracing) allocates containers
by the hundred thousand. At CPython's default thresholds (700, 10, 10) that start-up runs the
collector's full pass over the whole heap again and again (measured in docs/BENCHMARKS.md,
"Where the suite's CPU goes, and the collector's thresholds"). A first threshold of 20,000 lets the
short-lived containers of a trace die before a collection looks at them; garbage in reference
cycles is still collected, in larger batches, and a full pass waits for 8,000,000 net
allocations instead of 70,000.

Process-wide, so the library never calls it: programs do (run_experiment.py, the test session),
as they call `runtime.manage_workers()`.
"""

import gc

THRESHOLDS = (20_000, 20, 20)


def use_for_a_program() -> None:
  """Sets this process's collector thresholds to `THRESHOLDS`."""
  gc.set_threshold(*THRESHOLDS)
