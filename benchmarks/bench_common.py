"""Pieces every round-time benchmark shares: the clients, the FedAvg process, the timed loop."""

import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Optional

import portpicker

import tensorflow_federated as tff

from tff_dp.run_format import console

# The repository: the working directory of the command lines run here, and the workers' path.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def first_client_datasets(task, clients: int) -> list:
  """Preprocessed training datasets of the task's first `clients` clients (the same each round)."""
  ids = list(task.train_data.client_ids)[:clients]
  return [task.preprocess_train(task.train_data.create_tf_dataset_for_client(i)) for i in ids]


def fed_avg(model_fn, aggregator=None, *, client_learning_rate: float = 0.1,
            client_optimizer=None):
  """Unweighted FedAvg: client SGD (or `client_optimizer`), server SGD lr 1 with momentum 0.9."""
  return tff.learning.algorithms.build_unweighted_fed_avg(
      model_fn,
      client_optimizer_fn=client_optimizer or tff.learning.optimizers.build_sgdm(
          client_learning_rate),
      server_optimizer_fn=tff.learning.optimizers.build_sgdm(1.0, momentum=0.9),
      model_aggregator=aggregator)


def rotating_order(names: list, rounds: int) -> list:
  """The arms in the order they run: round i runs `names` rotated left by i, so position
  effects and machine noise hit every arm alike."""
  return [k for i in range(rounds) for k in names[i % len(names):] + names[:i % len(names)]]


def interleaved_median_seconds(processes: dict, states: dict, data, rounds: int) -> dict:
  """Median seconds per round of each process; `states` (already warmed up) is advanced.

  Arms run round by round in `rotating_order`.
  """
  times = {k: [] for k in processes}
  for k in rotating_order(list(processes), rounds):
    t0 = time.perf_counter()
    states[k] = processes[k].next(states[k], data).state
    times[k].append(time.perf_counter() - t0)
  return {k: statistics.median(v) for k, v in times.items()}


def run_command_rounds(cmd: list, env: dict, on_round) -> tuple[int, list[str]]:
  """Runs the `run_experiment.py` command line `cmd` to its end, calling `on_round(pid, round)`
  at each round's console line (the line comes after the round's outputs are written); returns
  its exit code and its last 15 lines of output."""
  tail = []
  with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        env=env, cwd=ROOT) as proc:
    for line in proc.stdout:
      tail = (tail + [line.rstrip()])[-15:]
      round_line = console.parse_round_line(line)
      if round_line is not None:
        on_round(proc.pid, round_line.round_num)
  return proc.returncode, tail


def start_worker(core: Optional[int] = None) -> tuple[subprocess.Popen, str]:
  """(process, 'host:port') of a loopback `python -m tff_dp.worker`, pinned to `core` with
  taskset when given; returns once it accepts connections."""
  port = portpicker.pick_unused_port()
  command = [sys.executable, '-m', 'tff_dp.worker', f'--port={port}']
  if core is not None:
    command = ['taskset', '-c', str(core)] + command
  proc = subprocess.Popen(command, env=dict(os.environ, PYTHONPATH=ROOT),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  for _ in range(600):
    if proc.poll() is not None:
      raise RuntimeError(f'worker (core {core}) exited at start-up')
    try:
      with socket.create_connection(('127.0.0.1', port), timeout=0.2):
        return proc, f'127.0.0.1:{port}'
    except OSError:
      time.sleep(0.1)
  raise RuntimeError('worker did not start')
