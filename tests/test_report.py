"""The console line of a round (tff_dp.training.report.report): what a user watching a run reads."""

from tff_dp.run_format import console
from tff_dp.training.report import report

_CLIP = 'aggregator/privacy_queries/update/l2_norm_clip'
_COUNT_CLIP = 'aggregator/privacy_queries/clipped_count/l2_norm_clip'


def test_a_dp_round_shows_clip_epsilons_eval_and_time():
  row = {'round': 7, 'num_clients': 19, 'train_loss': 0.123456, 'train_accuracy': 0.5,
         _CLIP: 0.25, _COUNT_CLIP: 0.5, 'epsilon_rdp': 1.23456, 'epsilon_pld': 0.98765,
         'eval_accuracy': 0.9, 'round_seconds': 1.234}
  assert report.console_line(row, 20) == (
      'round    7/20  clients  19  loss 0.1235  acc 0.5000  clip 0.25  eps_rdp 1.235  '
      'eps_pld 0.9877  eval_acc 0.9000  1.23s')


def test_per_group_clips_show_their_range_and_a_missing_epsilon_is_left_out():
  row = {'round': 12, 'num_clients': 3, 'train_loss': 2.0,
         'aggregator/privacy_queries/update/group_0/l2_norm_clip': 0.1,
         'aggregator/privacy_queries/update/group_1/l2_norm_clip': 2.5,
         'epsilon_rdp': 3.0, 'epsilon_pld': None}
  assert report.console_line(row, 100) == (
      'round   12/100  clients   3  loss 2.0000  clips 0.1..2.5  eps_rdp 3')


def test_canary_estimates_are_labelled_as_estimates_beside_the_proven_epsilon():
  """Issue 51, item 6: `eps_canary 1.13/2.9` stood unlabelled beside the proven 1.14."""
  row = {'round': 5, 'epsilon_rdp': 1.14, 'canary_epsilon_final_model': 1.13,
         'canary_epsilon_all_iterates': 2.9}
  assert report.console_line(row, 10) == (
      'round    5/10  eps_rdp 1.14  canary estimate (not a bound): final_model 1.13, '
      'all_iterates 2.9;')


def test_tools_read_back_the_round_and_its_seconds_from_the_line_and_nothing_else():
  """The one reader of the round's line (`run_format.console`), which the soak and round-time
  benchmarks and the memory test follow a run by: the literal lines of the tests above, a
  resumed run's and a skipped client's log lines."""
  read = console.parse_round_line
  assert read('round    7/20  clients  19  loss 0.1235  acc 0.5000  clip 0.25  eps_rdp 1.235  '
              'eps_pld 0.9877  eval_acc 0.9000  1.23s\n') == console.RoundLine(7, 20, 1.23)
  assert read('round   12/100  clients   3  loss 2.0000  clips 0.1..2.5  eps_rdp 3') == (
      console.RoundLine(12, 100, None))
  assert read('round    5/10  eps_rdp 1.14  canary estimate (not a bound): final_model 1.13, '
              'all_iterates 2.9;') == console.RoundLine(5, 10, None)
  assert read('round 1500/1500  1234.50s') == console.RoundLine(1500, 1500, 1234.5)
  for other in ('resuming at round 4', 'round 5: client 3 skipped: empty dataset',
                'could not checkpoint round 6 (disk full); `resume` restarts from round 5',
                'round 5/10x', ''):
    assert read(other) is None, other
