"""The thread governor: one thread while decodes stall, every core otherwise."""
import pytest

from geniex.llama import threads
from geniex.llama.threads import ThreadGovernor


class Recorder:
    """Stands in for a context's ``set_threads`` to record the governor's choices."""

    def __init__(self):
        self.calls = []

    def set_threads(self, n, nb):
        self.calls.append((n, nb))


@pytest.mark.fast
def test_two_stalls_in_a_row_drop_to_one_thread_then_it_tries_again():
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    for _ in range(10):
        g.observe(1, 0.010)
    g.observe(1, 0.500)                  # one hiccup: nothing
    g.observe(1, 0.011)
    assert ctx.calls == [] and not g.single
    g.observe(1, 0.500)
    g.observe(2, 0.700)                  # a 2-row batch, as slow per row
    assert ctx.calls == [(1, 1)] and g.single
    for _ in range(threads.FIRST_REST):
        g.observe(1, 0.020)
    assert ctx.calls[-1] == (2, 2) and not g.single
    g.observe(1, 0.5)
    g.observe(1, 0.5)                    # still busy: back to one thread, for longer
    assert ctx.calls[-1] == (1, 1) and g.left == 2 * threads.FIRST_REST


@pytest.mark.fast
def test_prompt_chunks_are_not_compared():
    ctx = Recorder()
    g = ThreadGovernor(ctx, 2, 2)
    g.observe(1, 0.010)
    for _ in range(5):
        g.observe(512, 2.0)
    assert ctx.calls == []


def test_switching_threads_mid_answer_keeps_the_answer(demo_model, monkeypatch):
    """With the default q8_0 cache, one thread and every core give bitwise the same
    logits: a governor that switches at every decode changes nothing in the answer."""
    from geniex.engine.loop import GenOptions
    from geniex.engine.sampling import SamplingParams
    from geniex.engine.session import LoadOptions, Session
    s = Session(demo_model, LoadOptions(nctx=1024, threads=2, threads_batch=2))
    try:
        prompt = s.vocab.tokenize("The history of the lighthouse begins " * 60)[:600]
        ref = s.generate(prompt, GenOptions(max_tokens=40, sampling=SamplingParams())).run()
        monkeypatch.setattr(threads, "SLOW", 0.0)          # every decode counts as a stall
        monkeypatch.setattr(threads, "FIRST_REST", 1)
        s.ctx.governor = ThreadGovernor(s.ctx, 2, 2)
        s.reset()
        got = s.generate(prompt, GenOptions(max_tokens=40, sampling=SamplingParams())).run()
        assert s.ctx.governor.switches >= 3
        assert got == ref
    finally:
        s.close()
