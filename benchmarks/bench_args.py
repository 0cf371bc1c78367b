"""Command-line parsing shared by the benchmarks: `--smoke` runs a benchmark at its smallest
settings (declared in the benchmark beside its parser), which the test suite does for every
benchmark so that none breaks unseen (tests/test_benchmarks.py). Its numbers mean nothing."""

import argparse
import sys
from typing import Optional, Sequence


def parse(parser: argparse.ArgumentParser, smoke: Sequence[str],
          argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
  """`parser`'s arguments; with `--smoke`, `smoke` is parsed first and the command line on top
  of it (so a test can still point output paths elsewhere)."""
  parser.add_argument('--smoke', action='store_true',
                      help=f'smallest settings, to check the benchmark runs: {" ".join(smoke)}')
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parser.parse_args(argv)
  if args.smoke:
    args = parser.parse_args(list(smoke) + argv)
  return args
