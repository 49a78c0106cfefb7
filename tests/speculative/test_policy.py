"""The draft-length policy alone (no model); inside the loop: tests/engine/test_loop_replay.py."""
import pytest

from geniex.speculative.policy import GainPolicy

pytestmark = pytest.mark.fast


def line(slope):
    """A verify cost curve where each extra row costs ``slope`` of a one-row decode."""
    return {r: 1 + slope * (r - 1) for r in (1, 2, 4, 8, 16)}



def trained(policy, method, accepted_share, steps=60, k=4):
    """Feed ``steps`` observations where each draft token is right with a fixed pattern."""
    for i in range(steps):
        ok = k if (i % 10) < accepted_share * 10 else 0
        draft = list(range(k))
        sampled = draft[:ok] + [99]
        policy.observe(method, draft, sampled, 0.0)
    return policy


def test_no_draft_when_drafts_are_wrong_and_rows_cost():
    p = trained(GainPolicy(line(0.3), one_row_seconds=0.01), "m", 0.0)
    assert p.acceptance("m") < 0.1
    assert p.best("m", 8) == 0
    assert p.cap(8) == 8                   # n-gram drafts cost nothing: offered, then cut, to keep learning
    assert p.take("m", 8) == 0


def test_long_drafts_when_they_are_accepted():
    p = trained(GainPolicy(line(0.3), one_row_seconds=0.01), "m", 1.0)
    assert p.acceptance("m") > 0.9
    assert p.best("m", 8) == 8


def test_free_rows_make_any_acceptance_worth_drafting():
    p = trained(GainPolicy(line(0.0), one_row_seconds=0.01), "m", 0.3)
    assert p.best("m", 8) == 8


def test_drafting_cost_counts():
    """The same acceptance drafted at a higher cost per token earns a shorter draft, down
    to none at a whole decode per token."""
    p = GainPolicy(line(0.05), one_row_seconds=0.01)
    for _ in range(30):
        p.observe("free", [1, 2], [1, 9], draft_time=0.0)
        p.observe("cheap", [1, 2], [1, 9], draft_time=0.005)   # half a row per token
        p.observe("slow", [1, 2], [1, 9], draft_time=0.02)     # one row per token
    assert p.best("free", 8) > p.best("cheap", 8) > p.best("slow", 8) == 0


def test_a_cut_draft_still_teaches():
    # k = 0 chosen, but the offered token is compared with the target's own token.
    p = GainPolicy(line(0.3), one_row_seconds=0.01)
    before = p.acceptance("m")
    for _ in range(10):
        p.observe("m", [5], [5], 0.0)
    assert p.acceptance("m") > before


def test_a_costly_drafter_that_never_pays_is_rarely_asked():
    p = GainPolicy(line(0.3), one_row_seconds=0.01)
    for _ in range(30):                    # drafting costs a whole decode per token
        p.observe("draft-simple", [1], [1], draft_time=0.01)
    assert p.best("draft-simple", 8) == 0
    asked = [p.cap(8) for _ in range(32)]
    assert asked.count(1) == 32 // 8 and asked.count(0) == 32 - 32 // 8


def test_the_measured_curve_decides():
    """A curve like the demo model's on 2 cores: a 2-row verify costs two decodes, so only
    long drafts that are usually right pay."""
    demo = {1: 1.0, 2: 2.03, 4: 2.84, 8: 4.19, 16: 7.87}
    good = trained(GainPolicy(demo, 0.007), "m", 1.0, steps=80, k=8)
    assert good.best("m", 8) >= 6
    poor = trained(GainPolicy(demo, 0.007), "m", 0.1, steps=80, k=8)
    assert poor.best("m", 8) == 0
    # 2 rows are priced at most as two one-row decodes (the loop could decode them so).
    assert GainPolicy(demo, 0.007).verify_cost(1) == pytest.approx(2.0)
    assert GainPolicy(demo, 0.007).verify_cost(31) == pytest.approx(7.87 + (7.87 - 4.19) * 16 / 8)


def test_grades_are_learnt_apart():
    """A drafter's confident drafts (grade 4: a long context matched) keep being drafted
    while its guesses from a bare key match (grade 1) are cut."""
    p = GainPolicy(line(0.3), one_row_seconds=0.01)
    for i in range(60):
        p.observe("m", [1, 2, 3, 4], [1, 2, 3, 4, 9], 0.0, grade=4)
        p.observe("m", [1, 2, 3, 4], [7], 0.0, grade=1)
    assert p.acceptance("m", 4) > 0.9 and p.acceptance("m", 1) < 0.1
    assert p.take("m", 8, grade=4) == 8
    assert p.take("m", 8, grade=1) == 0
    assert p.take("m", 8) == p.best("m", 8, 0)       # an ungraded draft has its own record


def test_a_new_record_starts_from_its_grades_prior():
    """Before any step is seen, a verbatim repeat (grade 4) is drafted and a bare key
    match (grade 1) is not, on the demo model's measured curve."""
    demo = {1: 1.0, 2: 2.03, 4: 2.84, 8: 4.19, 16: 7.87}
    p = GainPolicy(demo, 0.007)
    assert p.take("ngram-mod", 8, grade=4) >= 4
    assert p.take("ngram-mod", 8, grade=1) == 0


def test_a_model_drafters_probabilities_size_its_draft():
    """Tokens the drafter is sure of are verified, the draft is cut where its confidence
    drops; and what the target then says recalibrates the probabilities."""
    p = GainPolicy(line(0.3), one_row_seconds=0.01)
    sure, unsure = [0.99] * 3, [0.2] * 3
    middling = p.take("mtp", 6, probs=[0.6] * 6)
    assert middling > 0
    assert p.take("mtp", 6, probs=sure + unsure) == 3
    assert p.take("mtp", 6, probs=unsure + sure) == 0
    for _ in range(40):                    # the drafter is overconfident: its 0.99s are wrong
        p.observe("mtp", [1, 2, 3], [9], 0.0, probs=sure)
    assert p.take("mtp", 6, probs=sure + unsure) == 0
    assert p.take("mtp", 6, probs=[0.6] * 6) == middling     # another bucket: untouched


def test_the_curve_follows_the_thread_setting():
    """On one thread a batch row costs more: where the governor moved the context there,
    a draft that pays on every core is cut."""
    cores = {1: 1.0, 2: 2.03, 4: 2.84, 8: 4.19, 16: 7.87}
    one = {1: 1.0, 2: 2.5, 4: 4.2, 8: 7.6, 16: 14.5}
    p = trained(GainPolicy(cores, 0.007, others={"one": one}), "m", 0.9, steps=80, k=8)
    setting = ["all"]
    p.setting = lambda: setting[0]
    on_cores = p.best("m", 8)
    setting[0] = "one"
    assert p.verify_cost(8, "one") == pytest.approx(7.6 + (14.5 - 7.6) / 8)
    assert p.best("m", 8) < on_cores
    setting[0] = "all"
    assert p.best("m", 8) == on_cores


def test_a_slow_lookup_never_makes_an_ngram_method_costly():
    """An n-gram lookup's time does not grow with the draft: however slow one step was
    (a busy machine), the n-gram drafter is still asked for its whole draft, so a minimum
    draft length can never starve it of the drafts it learns from."""
    p = GainPolicy(line(0.3), one_row_seconds=0.01)
    for _ in range(30):
        p.observe("ngram-mod", [1, 2], [1, 9], draft_time=0.5, probs=[0.9, 0.9])
    assert p.cap(16) == 16
    assert p.take("ngram-mod", 4, probs=[0.99] * 4) == 4


def test_ngram_mod_probabilities_size_its_draft():
    """ngram-mod's per-token probabilities (from the match length) decide the length from
    the first step, before anything is learnt: a long match is drafted long, a short one
    with another conversation not at all."""
    demo = {1: 1.0, 2: 2.0, 4: 2.8, 8: 4.1, 16: 7.2}
    long_match = [1 - 1 / m for m in range(30, 46)]
    assert GainPolicy(demo, 0.007).take("ngram-mod", 16, probs=long_match) >= 12
    assert GainPolicy(demo, 0.007).take("ngram-mod", 16, probs=[0.0] * 4 + [0.8] * 12) == 0


def test_a_curve_is_made_monotone():
    """A batch measured cheaper than a smaller one (a quiet instant of a busy machine) is
    raised to it; a curve that already rises is kept as measured."""
    from geniex.speculative.policy import plausible
    assert plausible({1: 1.0, 2: 2.0, 4: 1.7, 8: 4.2, 16: 3.9}) == {1: 1.0, 2: 2.0, 4: 2.0, 8: 4.2, 16: 4.2}
    assert plausible({1: 1.0, 2: 0.8, 4: 1.07}) == {1: 1.0, 2: 1.0, 4: 1.07}
    demo = {1: 1.0, 2: 1.97, 4: 2.84, 8: 4.19, 16: 7.87}
    assert plausible(demo) == demo
    # Never above the rows decoded one at a time: 8 rows at 20 decodes was a stall.
    assert plausible({1: 1.0, 2: 4.5, 4: 9.0, 8: 20.1, 16: 30.0}) == {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0, 16: 16.0}
    # The policy prices drafts from the monotone curve.
    assert GainPolicy({1: 1.0, 2: 0.8, 4: 1.07, 8: 1.8, 16: 3.27}, 0.007).verify_cost(1) == 1.0


def test_a_curve_with_stalls_is_not_kept():
    """A batch measured well above its rows decoded one by one is a stall (another process
    held a core while OpenMP threads spun): such a curve is not cached for the model."""
    from geniex.speculative.policy import stalled
    assert stalled({1: 1.0, 2: 1.22, 4: 2.0, 8: 20.12, 16: 30.0})
    assert stalled({1: 1.0, 2: 3.5})
    assert not stalled({1: 1.0, 2: 2.03, 4: 2.84, 8: 4.19, 16: 7.87})


def test_beside_other_slots_a_verify_row_is_priced_at_the_whole_decode():
    # A device where rows are nearly free up to 8 and dear after (a GPU-like staircase):
    # alone, a fairly good drafter fills the 8 rows; beside seven answers' one row each,
    # any draft tips the shared decode over the step and slows all eight answers.
    costs = {1: 1.0, 2: 1.05, 3: 1.1, 4: 1.15, 5: 1.2, 6: 1.25, 7: 1.3, 8: 1.35, 16: 4.0}
    p = trained(GainPolicy(costs, one_row_seconds=0.01), "m", 0.7)
    assert p.best("m", 7) == 7
    p.company = lambda: (7, 7)
    assert p.best("m", 7) == 0
    p.company = lambda: (0, 0)                  # alone again: the same choice as without company
    assert p.best("m", 7) == 7
    # On a linear CPU curve the company changes little: the step's own rows dominate
    # neither way, and a draft that pays alone still pays beside one other answer.
    q = trained(GainPolicy(line(0.3), one_row_seconds=0.01), "m", 1.0)
    q.company = lambda: (1, 1)
    assert q.best("m", 8) == 8
