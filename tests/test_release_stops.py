"""Stops that keep their rounds, seeded re-execution and delta (issue 24): a resume never
re-executes a released round after an orderly stop, and a round re-executed after a crash is
accounted as what it is.

Oracles: dp_accounting composed in the test from the run's hyperparameters.
"""

import contextlib
import glob
import os
import signal

import dp_accounting
import numpy as np
import pytest
from tensorflow.python.framework import func_graph   # The graph a traced function builds.

from tff_dp import errors
from tff_dp import ledger as ledger_lib
from tff_dp.run_format import release
from tff_dp.training import config as config_lib
from tff_dp.training import experiment
from tff_dp.training.run_state import checkpointing
from tff_dp.training.run_state import privacy_recorder
from tff_dp.training.run_state import run_dir as run_dir_lib
from tff_dp.training.run_state import stop_signal
from run_helpers import metrics_rows
from run_helpers import round_of

POPULATION = 20   # conftest's tag_task.
Q, Z, DELTA = 0.1, 1.0, 1e-3


@pytest.fixture(scope='module')
def task(tag_task):
  return tag_task   # conftest: 20 generated training clients.


def _run(task, root, name, log=None, stop=None, **overrides):
  settings = dict(root_output_dir=str(root), experiment_name=name, task='stackoverflow_tag',
                  total_rounds=6, clients_per_round=int(Q * POPULATION), dp='fixed', clip=1.0,
                  noise_multiplier=Z, max_eval_examples=20, accounting=('rdp',), seed=3,
                  delta=DELTA, client_batch_size=8, rounds_per_checkpoint=10,
                  sampling_seed=5, rounds_per_eval=100)
  settings.update(overrides)
  cfg = config_lib.ExperimentConfig.from_settings(settings)
  return experiment.run(cfg, task, log=log or (lambda line: None), stop=stop)


def _epsilon(*zs):
  """RDP epsilon of Poisson(Q) rounds with these noise multipliers (one round each)."""
  acc = dp_accounting.rdp.RdpAccountant()
  for z in zs:
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(z)))
  return acc.get_epsilon(DELTA)


def _seed_holders_epsilon(rounds):
  """The headline of these seeded runs: against the seed holder, `rounds` known releases of
  multiplier Z are one Gaussian of Z / sqrt(rounds) (RDP, as the runs account)."""
  acc = dp_accounting.rdp.RdpAccountant()
  return acc.compose(dp_accounting.GaussianDpEvent(Z / rounds ** 0.5)).get_epsilon(DELTA)


def _ledger_rounds(run_dir):
  return [r.round_num for r in ledger_lib.read_ledger(os.path.join(run_dir, 'ledger.jsonl'))]


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_max_epsilon_stop_keeps_its_rounds_so_raising_the_cap_reexecutes_nothing(task, tmp_path):
  # The cap is checked against the headline (issue 50): stops before round 4.
  cap = (_seed_holders_epsilon(3) + _seed_holders_epsilon(4)) / 2
  lines = []
  summary = _run(task, tmp_path, 'cap', log=lines.append, max_epsilon=cap)
  assert summary.rounds_completed == 3 and summary.stopped_by_max_epsilon
  assert os.path.isdir(tmp_path / 'cap' / 'checkpoints' / 'round_3')   # Not a 10th round.
  stop_line = next(l for l in lines if l.startswith('stopping before round 4'))
  assert 'rounds 1-3 are kept' in stop_line and 'crash' not in stop_line
  summary = _run(task, tmp_path, 'cap', max_epsilon=100.0, resume=True)
  assert summary.rounds_completed == 6
  assert _ledger_rounds(summary.run_dir) == [1, 2, 3, 4, 5, 6]   # Nothing re-executed.
  assert float(metrics_rows(summary.run_dir)[-1]['epsilon_rdp']) == pytest.approx(
      _epsilon(*[Z] * 6), rel=1e-6)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_second_signal_keeps_the_completed_rounds(task, tmp_path):
  """Even where the abort leaves the thread inside a function TensorFlow was tracing: a CI
  run's Ctrl-C twice (test_interruptions) once landed there, and round 1's checkpoint failed
  (`tf.saved_model.save` refuses to run inside a traced function)."""
  stop = stop_signal.StopSignal(lambda line: None)
  interrupted_trace = contextlib.ExitStack()

  def log(line):   # A second Ctrl-C, landing in a trace, as round 3's outputs are released.
    if round_of(line) == 3:
      stop.received = signal.SIGINT
      interrupted_trace.enter_context(func_graph.FuncGraph('interrupted').as_default())
      raise KeyboardInterrupt

  with interrupted_trace, pytest.raises(errors.RunInterrupted,
                                        match='rounds 1-3 are kept') as raised:
    _run(task, tmp_path, 'twice', log=log, stop=stop)
  assert raised.value.signum == signal.SIGINT
  assert os.path.isdir(tmp_path / 'twice' / 'checkpoints' / 'round_3')
  summary = _run(task, tmp_path, 'twice', resume=True)
  assert _ledger_rounds(summary.run_dir) == [1, 2, 3, 4, 5, 6]
  assert summary.privacy['epsilon_if_seed_secret']['rdp'] == pytest.approx(
      _epsilon(*[Z] * 6), rel=1e-6)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
@pytest.mark.parametrize('rounds_per_checkpoint', [10, 1])
def test_a_second_signal_as_a_round_is_released_says_what_resume_does(task, tmp_path,
                                                                      monkeypatch,
                                                                      rounds_per_checkpoint):
  """A second Ctrl-C as round 3's outputs are released, after its hooks took it in (the EMA
  updated, the model evaluated).

  Round 2 not checkpointed (10): a checkpoint of round 2 would hold round 3's EMA, and a resume
  would take round 3 into it twice. None is written, the stop says so, and `resume` restarts
  from the last checkpoint (none: round 1) and counts what it re-executes.
  Every round checkpointed (1): round 3's checkpoint is written before its outputs, so `resume`
  continues at round 4, which the stop used to misstate as round 3."""
  stop = stop_signal.StopSignal(lambda line: None)
  released_row = release.released_row

  def cut(row, facts):
    if row['round'] == 3:
      stop.received = signal.SIGINT
      raise KeyboardInterrupt
    return released_row(row, facts)

  settings = dict(ema_beta=0.9, rounds_per_eval=1, rounds_per_checkpoint=rounds_per_checkpoint)
  monkeypatch.setattr(release, 'released_row', cut)
  with pytest.raises(errors.RunInterrupted) as raised:
    _run(task, tmp_path, 'hooks', stop=stop, **settings)
  checkpoints = glob.glob(str(tmp_path / 'hooks' / '**' / 'round_*'), recursive=True)
  latest = max((int(os.path.basename(c)[len('round_'):]) for c in checkpoints), default=None)
  assert latest == (None if rounds_per_checkpoint == 10 else 3)
  monkeypatch.setattr(release, 'released_row', released_row)
  lines = []
  summary = _run(task, tmp_path, 'hooks', log=lines.append, resume=True, **settings)
  rows = [int(r['round']) for r in metrics_rows(summary.run_dir)]
  if rounds_per_checkpoint == 10:
    assert 'could not all be checkpointed; `resume` restarts after round 0' in str(raised.value)
    assert any(l.startswith('resuming at round 1 ') for l in lines), lines
    assert rows == [1, 2, 3, 4, 5, 6]
    # Rounds 1-2 ran twice and count twice; round 3 released nothing before the resume.
    assert _ledger_rounds(summary.run_dir) == [1, 2, 1, 2, 3, 4, 5, 6]
  else:
    assert '`resume` continues at round 4' in str(raised.value), raised.value
    assert 'resuming at round 4' in lines, lines
    assert rows == [1, 2, 4, 5, 6]
    assert _ledger_rounds(summary.run_dir) == [1, 2, 3, 4, 5, 6]   # Each round once.


def test_a_checkpoint_a_second_signal_cut_after_its_write_is_kept(tmp_path):
  """The stop's checkpoint of the last completed round, cut short by a second signal after its
  atomic rename (while older checkpoints were removed): the abort's attempt to write that round
  again finds it complete and keeps it (TFF refuses to write a round twice; that refusal used to
  end the run in a traceback, the round unrecorded as checkpointed)."""
  run = run_dir_lib.RunDirectory(str(tmp_path), 'cut', resume=False)
  run.create(tensorboard=False)
  state = {'weights': np.arange(3, dtype=np.float32)}
  try:
    checkpointing.save(run, 2, state, [])   # The cut save: written, not yet recorded.
    progress = checkpointing.Progress(round_num=2, state=state, checkpointed=1)
    lines = []
    assert checkpointing.save_completed_rounds(run, [], progress, lines.append)
    assert progress.checkpointed == 2 and lines == []
    loaded = checkpointing.load_latest(run, state, [])
  finally:
    run.close()
  assert int(loaded['round_num']) == 2
  np.testing.assert_array_equal(loaded['state']['weights'], state['weights'])


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_seeded_round_reexecuted_after_a_crash_is_one_sample_released_twice(task, tmp_path):
  class Crash(Exception):
    pass

  def log(line):   # The process dies after releasing round 3, before any checkpoint.
    if round_of(line) == 3:
      raise Crash

  with pytest.raises(Crash):
    _run(task, tmp_path, 'crash', log=log)
  summary = _run(task, tmp_path, 'crash', resume=True)
  assert _ledger_rounds(summary.run_dir) == [1, 2, 3, 1, 2, 3, 4, 5, 6]
  # Rounds 1-3 drew the same clients twice: each is one sampled Gaussian at Z / sqrt(2).
  expected = _epsilon(*[Z * 2 ** -0.5] * 3, *[Z] * 3)
  assert float(metrics_rows(summary.run_dir)[-1]['epsilon_rdp']) == pytest.approx(
      expected, rel=1e-6)
  assert expected > _epsilon(*[Z] * 9) * 1.05   # What the ledger claimed before.


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_seeded_run_headline_holds_against_the_seed_holder(task, tmp_path):
  summary = _run(task, tmp_path, 'seeded', total_rounds=3)
  privacy = summary.privacy
  # Whoever holds the seed knows every sample: three Gaussian releases at Z, no amplification.
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.GaussianDpEvent(Z / 3 ** 0.5))
  assert privacy['epsilon']['rdp'] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
  assert privacy['epsilon_if_seed_secret']['rdp'] == pytest.approx(_epsilon(Z, Z, Z), rel=1e-6)
  assert 'sampling seed' in privacy['guarantee']


def test_delta_at_or_above_one_over_population_is_refused_before_anything_is_written(
    task, tmp_path):
  with pytest.raises(errors.UserInputError, match='1/population'):
    _run(task, tmp_path, 'delta', delta=0.05)
  assert os.listdir(tmp_path) == []


def test_max_epsilon_prediction_holds_whatever_last_bits_the_next_round_gets():
  # Adaptive clipping: the next round's stddev is float32(z * clip_next) for a new float32 clip,
  # so stddev / clip moves in its last bits. The prediction must not be below what runs.
  import numpy as np
  z = np.float32(1.1547005)
  last = (ledger_lib.GaussianSumQuery('update', np.float32(0.31), np.float32(0.31) * z),)
  predicted = privacy_recorder.next_round_bound(last)
  worst = 1.0
  for clip in np.float32(0.3) + np.arange(2000, dtype=np.float32) * np.float32(1e-5):
    # The ratio the next round could run with, computed as float32 does it.
    worst = min(worst, float(np.float32(clip) * z) / float(clip) / float(z))
  ratio = predicted[0].noise_stddev / predicted[0].l2_norm_clip / float(z)
  assert ratio <= worst   # Less noise than any next round: an upper bound on its epsilon.
  # dp_accounting: one more round at the bound's multiplier is at least the worst real one.
  def eps(multiplier):
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(Q, dp_accounting.GaussianDpEvent(multiplier)))
    return acc.get_epsilon(DELTA)
  assert eps(float(z) * ratio) >= eps(float(z) * worst)
