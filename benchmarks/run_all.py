"""Runs every benchmark in sequence (`make bench`); each prints its own ratios from one run."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = [
    ['bench_rounds.py'],                  # s/round per task; DP vs plain FedAvg
    ['bench_factories.py'],               # every aggregator vs plain/TFF DP: time, peak memory
    ['bench_cli_rounds.py'],              # command-line rounds with checkpoints: BandMF vs fixed
    ['bench_mechanisms.py'],              # DP-FTRL mechanisms' noise in the model at equal epsilon
    ['bench_throughput.py'],              # our whole round vs plain TFF without DP (<= 1.2x)
    ['bench_limit.py'],                   # our round vs raw TF client work and TFF defaults
    ['bench_worker_threads.py'],          # the worker's inter-op pool: TF's size vs ours
    ['bench_scaling.py'],                 # round time vs clients/round and vs loopback workers
    ['bench_client_bytes.py'],            # bytes sent per round to a worker: datasets vs client ids
    ['bench_workers.py'],                 # 1 vs 2 pinned loopback workers (concurrent slices)
    ['bench_adaptive_vs_tff.py'],         # our adaptive factory vs TFF's gaussian_adaptive
    ['bench_accountant.py'],              # incremental epsilon over a 10,000-round ledger
    ['bench_adadps.py'],                  # AdaDPS vs DP-FedAvg (sparse toy + StackOverflow tag)
    ['bench_checkpoint_aggregation.py'],  # EMA / past-k costs
    ['bench_evaluation.py'],              # central evaluation: compiled vs eager, s per evaluation
    ['bench_noise_cohort.py'],            # m clients with the noise of M vs a real M-client round
    ['bench_canaries.py'],                # canary estimates vs proven epsilon; their cost (~45 min)
    ['bench_soak.py'],                    # RSS growth over 500 CLI rounds (~45 min)
    # 1,000 clients vs full-size populations (generates the 342,477-client StackOverflow cache
    # once, ~5 min); StackOverflow tag at 100 clients/round needs ~10-11 GB (TFF worker).
    ['bench_population.py', '--max_rss_gb=16'],
]


def main():
  env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE), TF_CPP_MIN_LOG_LEVEL='3')
  failed = []
  for args in BENCHMARKS:
    print(f'\n=== {" ".join(args)} ===', flush=True)
    if subprocess.call([sys.executable, os.path.join(HERE, args[0])] + args[1:], env=env):
      failed.append(args[0])
  if failed:
    sys.exit(f'failed: {", ".join(failed)}')


if __name__ == '__main__':
  main()
