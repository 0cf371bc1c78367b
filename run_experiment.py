"""Runs a user-level DP federated learning experiment (DP-FedAvg on TFF) from flags.

Example (the embedded default dataset, no download):
  python run_experiment.py --task=emnist --dp=adaptive --clip=0.1 --noise_multiplier=0.3

Every flag is a setting of `tff_dp.ExperimentConfig` (`--helpshort` lists them by section);
the run is `tff_dp.run(config)`. Outputs go to ROOT_OUTPUT_DIR/EXPERIMENT_NAME: metrics.csv (one
row per round, epsilon included), ledger.jsonl (privacy ledger), checkpoints/, tensorboard/,
plots/*.png, config.json (every setting). Bad input, unknown flags included, exits with code 2
and one `error:` line, before TensorFlow is imported; an existing run directory is never
touched unless --resume is given.
"""

import os
import signal
import sys

from tff_dp.execution import gc_thresholds  # No TensorFlow.
from tff_dp.execution import native_logs  # No TensorFlow: imported first.
from tff_dp.training.run_state import stop_signal  # No TensorFlow: imported first.


def _end_during_start_up(signum: int) -> None:
  """A signal before anything of the run is written: the process ends here, at once, with one
  line and 128 + signal (nothing is lost; the next step of start-up at which a flag would be
  seen can be seconds away, and a KeyboardInterrupt raised inside TensorFlow's import, where
  this signal usually lands, can be swallowed)."""
  try:
    sys.stdout.flush()
  except RuntimeError:   # The signal came in the middle of a write to stdout: it is lost.
    pass
  line = f'{stop_signal.stopped_line(signum)}\n'.encode()
  os.write(native_logs.real_stderr_fd() or sys.stderr.fileno(), line)   # Not through a pipe.
  os._exit(128 + signum)   # pylint: disable=protected-access


# Installed before TensorFlow is imported, so that Ctrl-C or SIGTERM at any moment of start-up
# is seen (a KeyboardInterrupt raised inside TF's import or its gc callbacks can be swallowed)
# and ends the run with one line and exit code 128 + signal.
_STOP = (stop_signal.StopSignal(print, end_start_up=_end_during_start_up).install()
         if __name__ == '__main__' else None)

import tasks  # noqa: E402  (registers the repository's tasks and their settings; no TensorFlow)
from tff_dp import cli_flags  # noqa: E402
from tff_dp.errors import RunFailedError  # noqa: E402
from tff_dp.errors import RunInterrupted  # noqa: E402
from tff_dp.errors import UserInputError  # noqa: E402
from tff_dp.training import config_flags  # noqa: E402  (no TensorFlow)
from tff_dp.training import preflight  # noqa: E402  (no TensorFlow)

# Flag names, to print the library's `parameter` names as this command's --flags.
FLAG_NAMES = frozenset(config_flags.new_flag_values())


def main(argv) -> int:
  """argv (program name first) -> exit code: 0 done, 2 bad input, 1 failed run, 128 + signal."""
  if any(a in cli_flags.HELP_FLAGS for a in argv[1:]):
    print(f'{__doc__.strip()}\n\n{config_flags.help_text(config_flags.new_flag_values())}')
    return 0
  try:
    cfg = config_flags.parse(argv[1:])   # Checked before TensorFlow is imported.
    preflight.check(cfg)   # The data, the run directory, a resume: still no TensorFlow.
    if _STOP is not None:
      _STOP.raise_if_received('during start-up')
    if not cfg.runtime.native_logs:   # This process is ours: TensorFlow's INFO lines off.
      os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
    # pylint: disable=g-import-not-at-top  (start-up time: a flag error is reported first)
    from absl import flags
    import tff_dp
    if not flags.FLAGS.is_parsed():   # absl logging expects parsed flags; ours are separate.
      flags.FLAGS.mark_as_parsed()
    summary = tff_dp.run(cfg, stop=_STOP, log=lambda line: print(_as_flags(line)))
  except UserInputError as e:
    return cli_flags.report(e, FLAG_NAMES)
  except RunFailedError as e:
    print(f'error: {_as_flags(str(e))}', file=sys.stderr)
    return 1
  except RunInterrupted as e:
    print(_as_flags(str(e)), file=sys.stderr)
    return 128 + e.signum
  except KeyboardInterrupt:   # A second Ctrl-C: abort at once (the ledger stays valid).
    print(f'error: {_aborted()}', file=sys.stderr)
    return 130
  if summary.stopped_by_signal:
    signum = int(getattr(signal, summary.stopped_by_signal))
    when = (f'after round {summary.rounds_completed}' if summary.rounds_completed
            else 'before round 1')
    print(f'stopped by {summary.stopped_by_signal} {when}; outputs in {summary.run_dir} are '
          'consistent: continue with --resume')
    return 128 + signum
  print(f'done: {summary.rounds_completed} rounds; outputs in {summary.run_dir}')
  return 0


def _aborted() -> str:
  """What an abort (a second Ctrl-C) leaves, as far as this process got."""
  if _STOP is None or _STOP.run_dir is None:
    return 'interrupted during start-up; nothing of the run was written'
  return (f'interrupted; what {_STOP.run_dir} holds is intact (the ledger counts every round '
          'that ran): continue with --resume')


def _as_flags(line: str) -> str:
  return cli_flags.as_flags(line, FLAG_NAMES)


if __name__ == '__main__':
  gc_thresholds.use_for_a_program()   # Before TensorFlow is imported: start-up's CPU.
  cli_flags.exit_now(main(sys.argv))   # No teardown of TensorFlow: every file is closed.
