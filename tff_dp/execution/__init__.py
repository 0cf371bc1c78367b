"""How TFF executes a run's computations: the local worker's life (`runtime`), the native log
lines it writes (`native_logs`), its executor cache (`executor_cache`), and remote workers
(`distributed`, their addresses in `worker_addresses`; `python -m tff_dp.worker` starts one),
and the collector thresholds a program running TFF sets (`gc_thresholds`)."""
