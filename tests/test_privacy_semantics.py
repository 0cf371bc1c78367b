"""What a run's epsilon covers, and a resumed run being the same run (issue 12).

Oracles are independent of the code under test: dp_accounting composed directly in the test,
a plain-Python reading of the documented seeded draw, and literal lists of what may be written.
"""

import json
import os
import signal
import subprocess
import time

import dp_accounting
import numpy as np
import pytest

import run_experiment
from tff_dp import errors
from tff_dp import ledger as ledger_lib
from tff_dp import sampling
from tff_dp.run_format import console
from tff_dp.training import config as config_lib
from tff_dp.training import experiment
from run_helpers import metrics_rows
from run_helpers import script
from run_helpers import script_env
from run_helpers import seeded_draw

POPULATION = 20


@pytest.fixture(scope='module')
def data_dir(tag_data_dir):
  return tag_data_dir   # conftest: POPULATION generated training clients.


@pytest.fixture(scope='module')
def task(tag_task):
  return tag_task


def _config(root, name, **overrides):
  cfg = dict(root_output_dir=str(root), experiment_name=name, task='stackoverflow_tag',
             total_rounds=4, clients_per_round=5, dp='fixed', clip=1.0, noise_multiplier=0.8,
             max_eval_examples=50, accounting=('rdp',), seed=3, delta=1e-3,
             client_batch_size=8)
  cfg.update(overrides)
  return config_lib.ExperimentConfig.from_settings(cfg)


def _run(task, root, name, log=None, **overrides):
  lines = []
  summary = experiment.run(_config(root, name, **overrides), task,
                           log=lines.append if log is None else log)
  return summary, lines


def _rdp_epsilon(q, z, rounds, delta):
  """Epsilon of `rounds` Poisson-sampled Gaussian rounds, straight from dp_accounting."""
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds)
  return acc.get_epsilon(delta)


def _tree(path):
  return sorted(os.path.relpath(os.path.join(r, f), path)
                for r, _, fs in os.walk(path) for f in fs)


# 1. --max_epsilon is checked before round 1.

@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_max_epsilon_below_the_first_round_refuses_to_start(task, tmp_path):
  first = _rdp_epsilon(5 / POPULATION, 0.8, 1, 1e-3)
  with pytest.raises(errors.UserInputError, match='first round alone'):
    _run(task, tmp_path, 'capped', max_epsilon=first * 0.99)
  assert not os.path.exists(tmp_path / 'capped')   # No ledger record, no run directory.
  summary, _ = _run(task, tmp_path, 'fits', max_epsilon=first * 1.01, total_rounds=3)
  assert summary.rounds_completed == 1 and summary.stopped_by_max_epsilon
  records = ledger_lib.read_ledger(os.path.join(summary.run_dir, 'ledger.jsonl'))
  assert len(records) == 1


# 2. Client sampling is secret unless a sampling seed is given.

def test_secret_sampler_is_not_reproducible_but_stable_within_a_round():
  ids = list(range(1000))
  a, b = sampling.PoissonSampler(ids, 0.1), sampling.PoissonSampler(ids, 0.1)
  assert a.secret and not sampling.PoissonSampler(ids, 0.1, seed=0).secret
  assert a.sample(1) == a.sample(1)            # The prefetched round is the round run.
  assert a.sample(1) != b.sample(1)            # P(equal) is astronomically small.
  sizes = [len(a.sample(r)) for r in range(2, 202)]
  assert abs(np.mean(sizes) - 100) < 3         # Binomial(1000, 0.1): stddev of mean 0.67.
  fixed = sampling.FixedSizeSampler(ids[:50], 10)
  counts = np.zeros(50)
  for r in range(2000):
    picked = fixed.sample(r)
    assert len(set(picked)) == 10
    counts[picked] += 1
  # Each client is in a round with probability 1/5: 400 expected, stddev ~18.
  assert np.all(np.abs(counts - 400) < 100)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_run_samples_are_not_recomputable_from_its_seed(task, tmp_path):
  def observed(name, **kw):
    summary, _ = _run(task, tmp_path, name, total_rounds=8, **kw)
    with open(os.path.join(summary.run_dir, 'summary.json')) as f:
      return [int(r['num_clients']) for r in metrics_rows(summary.run_dir)], json.load(f)

  def predicted(seed):   # What anyone holding a seed computes (plain Python, not our sampler).
    return [sum(seeded_draw(seed, r, c) < 5 / POPULATION for c in task.train_data.client_ids)
            for r in range(1, 9)]

  secret_sizes, secret_summary = observed('secret')
  assert secret_sizes != predicted(3)            # --seed=3 does not reveal the samples.
  assert secret_summary['privacy']['sampling']['secret'] is True
  with open(tmp_path / 'secret' / 'config.json') as f:
    assert json.load(f)['sampling_seed'] is None
  seeded_sizes, seeded_summary = observed('seeded', sampling_seed=11)
  assert seeded_sizes == predicted(11)
  assert seeded_summary['privacy']['sampling']['secret'] is False
  assert 'seed' in seeded_summary['privacy']['sampling']['note']


# 3. A round whose sample is empty is run on a zero sum and recorded.

@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_empty_rounds_are_noised_and_recorded(task, tmp_path):
  q = 1 / POPULATION
  ids = task.train_data.client_ids
  seed = next(s for s in range(1000)   # A seed whose round 2 draws nobody (plain-Python oracle).
              if not any(seeded_draw(s, 2, c) < q for c in ids)
              and any(seeded_draw(s, 1, c) < q for c in ids))
  summary, lines = _run(task, tmp_path, 'empty', clients_per_round=1, total_rounds=4,
                        sampling_seed=seed, rounds_per_eval=1)
  records = ledger_lib.read_ledger(os.path.join(summary.run_dir, 'ledger.jsonl'))
  assert [r.round_num for r in records] == [1, 2, 3, 4]
  rows = metrics_rows(summary.run_dir)
  assert rows[1]['num_clients'] == '0'
  assert not any('no client' in line for line in lines)
  assert float(rows[-1]['epsilon_rdp']) == pytest.approx(_rdp_epsilon(q, 0.8, 4, 1e-3),
                                                         rel=1e-6)
  # The model moved by noise alone in the empty round: its eval loss changed.
  assert rows[1]['eval_loss'] != rows[0]['eval_loss']


# 7. The privacy statement, and --private_release.

DIAGNOSTICS = ('num_clients', 'clients_rejected', 'train_loss', 'train_accuracy',
               'round_seconds', 'wall_seconds', 'aggregator/zero_updates',
               'aggregator/non_finite_zeroed')


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_private_release_writes_and_prints_no_diagnostic(task, tmp_path):
  summary, lines = _run(task, tmp_path, 'public', private_release=True, total_rounds=3,
                        dp='adaptive', clip=0.5, noise_multiplier=0.5, clipped_count_stddev=2.0,
                        accounting=('rdp', 'pld'), pld_every=1, eval_data='holdout',
                        eval_holdout_clients=4)
  run_dir = summary.run_dir
  columns = set(metrics_rows(run_dir)[0])
  assert not columns & set(DIAGNOSTICS)
  # Evaluation on held-out clients (not in the population) is covered.
  assert {'round', 'epsilon_rdp', 'epsilon_pld', 'eval_accuracy',
          'aggregator/clip'} <= columns
  # TensorBoard events carry wall-clock times: none are written.
  assert not os.path.exists(os.path.join(run_dir, 'tensorboard'))
  round_lines = [l for l in lines if console.parse_round_line(l) is not None]
  assert len(round_lines) == 3
  assert not any('clients' in l or 'loss' in l or l.rstrip().endswith('s') for l in round_lines)
  with open(os.path.join(run_dir, 'summary.json')) as f:
    statement = json.load(f)['privacy']
  # No diagnostic column or console line; the run directory's .lock (a pid) is the operator's.
  assert statement['private_release']
  assert [d.split(':')[0] for d in statement['non_private_diagnostics']] == ['.lock']
  assert statement['neighboring_relation'] == 'replace_special'   # q = m / N: zero-out.
  assert statement['delta'] == 1e-3
  assert statement['epsilon']['rdp'] == pytest.approx(float(metrics_rows(run_dir)[-1]
                                                            ['epsilon_rdp']))
  assert any(l.startswith('privacy: user-level') for l in lines)


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_default_run_lists_its_diagnostics_in_the_statement(task, tmp_path):
  summary, _ = _run(task, tmp_path, 'default', total_rounds=1)
  with open(os.path.join(summary.run_dir, 'summary.json')) as f:
    statement = json.load(f)['privacy']
  assert not statement['private_release']
  assert {'num_clients', 'train_loss', 'round_seconds'} <= set(
      statement['non_private_diagnostics'])


# 8. --resume refuses changed settings.

@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_resume_refuses_changed_mechanism_and_records_allowed_changes(task, tmp_path):
  _run(task, tmp_path, 'exp', total_rounds=2)
  # .lock included: a refused resume leaves the run directory as it was, to the byte.
  before = {p: open(tmp_path / 'exp' / p, 'rb').read() for p in _tree(tmp_path / 'exp')}
  for change, named in [(dict(noise_multiplier=2.0), '`noise_multiplier` was 0.8, now 2.0'),
                        (dict(clip=5.0), '`clip` was 1.0, now 5.0'),
                        (dict(clients_per_round=10), '`clients_per_round` was 5, now 10'),
                        (dict(dp='adaptive'), "`dp` was 'fixed', now 'adaptive'"),
                        (dict(task='emnist'), "`task` was 'stackoverflow_tag', now 'emnist'"),
                        (dict(client_batch_size=4), '`client_batch_size` was 8, now 4')]:
    with pytest.raises(errors.UserInputError) as e:
      experiment.run(_config(tmp_path, 'exp', total_rounds=3, resume=True, **change), task,
                     log=lambda line: None)
    assert named in str(e.value)
    after = {p: open(tmp_path / 'exp' / p, 'rb').read() for p in _tree(tmp_path / 'exp')}
    assert after == before
  summary, _ = _run(task, tmp_path, 'exp', total_rounds=3, resume=True)
  assert summary.rounds_completed == 3
  with open(tmp_path / 'exp' / 'config_history.jsonl') as f:
    history = [json.loads(line) for line in f]
  assert history[-1]['_changed_on_resume'] == {'total_rounds': {'was': 2, 'now': 3}}


# 10. Every flag is validated before anything is created on disk (CLI in-process).

@pytest.mark.parametrize('args,flag', [
    (['--pld_every=0'], '--pld_every'),
    (['--accounting=foo'], '--accounting'),
    (['--clip=inf'], '--clip'),
    (['--client_learning_rate=nan'], '--client_learning_rate'),
    (['--server_learning_rate=-1'], '--server_learning_rate'),
    (['--max_eval_examples=-5'], '--max_eval_examples'),
    (['--uncertainty_last_k=1'], '--uncertainty_last_k'),
    (['--experiment_name='], '--experiment_name'),
    (['--noise_multiplier=inf'], '--noise_multiplier'),
    (['--loop_implementation=reduce'], '--loop_implementation'),
])
def test_bad_flags_exit_2_before_anything_is_written(args, flag, tmp_path, capsys):
  root = tmp_path / 'runs'
  argv = ['run_experiment.py', '--dp=fixed', '--clip=1', '--noise_multiplier=1',
          f'--root_output_dir={root}', '--experiment_name=exp', '--data_dir=/nonexistent'] + args
  code = run_experiment.main(argv)
  err = capsys.readouterr().err
  lines = [l for l in err.splitlines() if l.startswith('error:')]
  assert code == 2 and len(lines) == 1 and flag in lines[0], err
  assert not root.exists() or not os.listdir(root)


# 11. Ctrl-C at any moment of start-up ends the run with exit 130 and one line.

@pytest.mark.slow
@pytest.mark.parametrize('delay', [2.0, 7.0])
def test_sigint_during_start_up_exits_130(delay, tmp_path, data_dir):
  proc = subprocess.Popen(
      script('run_experiment.py') + [
          '--task=stackoverflow_tag', f'--data_dir={data_dir}', '--so_vocab_size=200',
          '--so_tag_vocab_size=30', '--dp=fixed', '--clip=1', '--noise_multiplier=1',
          '--clients_per_round=5', '--total_rounds=5', f'--root_output_dir={tmp_path}',
          '--experiment_name=exp'],
      env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  time.sleep(delay)
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 130, (out, err)
  assert 'Traceback' not in err and 'Traceback' not in out
  assert len([l for l in err.splitlines() if l.strip()]) <= 1, err
  assert 'round    5/5' not in out


@pytest.mark.slow   # An end-to-end run: not in `make test-fast`.
def test_dp_noise_is_not_a_function_of_the_seeds(task, tmp_path):
  """--seed and --sampling_seed reproduce everything but the noise (which must stay secret)."""
  def first_eval_loss(name, z):
    summary, _ = _run(task, tmp_path, name, total_rounds=1, sampling_seed=5, noise_multiplier=z)
    return metrics_rows(summary.run_dir)[0]['eval_loss']
  assert first_eval_loss('quiet_a', 0.0) == first_eval_loss('quiet_b', 0.0)
  assert first_eval_loss('noisy_a', 1.0) != first_eval_loss('noisy_b', 1.0)
