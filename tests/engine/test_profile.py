"""The profile printed after an answer, and its trip through the server's usage."""
import pytest

from geniex import profile
from geniex.engine.stats import Stats

pytestmark = pytest.mark.fast


def answer_stats():
    s = Stats(prompt_tokens=30, prompt_reused=10, prompt_time=0.05, ttft=0.08,
              decode_time=0.5, total_time=0.6, stop_reason="length", spec_types=("ngram-mod",))
    s.record_step(0, 0, offered=6)          # the policy verified none of 6 offered
    s.record_step(4, 4, draft_time=0.02, verify_time=0.11, offered=7)          # 4 of 7
    s.record_step(2, 1, offered=2)
    s.decode_tokens = 9
    return s


def test_the_verbose_block_says_what_the_policy_verified():
    block = profile.block(answer_stats())
    assert "draft policy:   verified 6 of 15 offered draft tokens; 1 steps verified none of their draft" in block
    assert "draft accept:   5/6 (83.3%)" in block
    assert "accepted/step:  1:1 4:1   (steps: 3)" in block


def test_no_policy_line_when_every_offered_token_was_verified():
    s = Stats()
    s.record_step(3, 3, offered=3)
    assert "draft policy" not in profile.block(s)


def test_run_rebuilds_the_same_profile_from_the_servers_usage():
    """`geniex run` prints the profile from the response's timings: the same text."""
    s = answer_stats()
    usage = {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.decode_tokens,
             "completion_tokens_details": {"accepted_prediction_tokens": s.accepted,
                                           "rejected_prediction_tokens": s.drafted - s.accepted},
             "timings": profile.timings(s)}
    again = profile.from_usage(usage)
    assert profile.block(again) == profile.block(s)
    assert profile.line(again) == profile.line(s)
    assert "draft time:     0.02 s   verify time: 0.11 s" in profile.block(again)
    for _, attr, _ in profile.CARRIED:
        assert getattr(again, attr) == pytest.approx(getattr(s, attr)), attr


def test_openai_counts_alone_still_give_the_acceptance():
    """A response without ``timings`` (a client that strips them) still says how many
    drafts were accepted, from OpenAI's predicted-output counts."""
    again = profile.from_usage({"prompt_tokens": 5, "completion_tokens": 7, "completion_tokens_details":
                                {"accepted_prediction_tokens": 3, "rejected_prediction_tokens": 1}})
    assert (again.prompt_tokens, again.decode_tokens, again.accepted, again.drafted) == (5, 7, 3, 4)
