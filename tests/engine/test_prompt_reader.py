"""Prompts read in an F16 context and moved into the target's quantized cache
(geniex.engine.prompt_reader, geniex.llama.kv_state): the cells are what a fresh read
writes whatever was cached before and however the read is cut, and the answers are the
target's own."""
import time

import numpy as np
import pytest

from geniex.engine import prompt_reader
from geniex.engine.loop import GenOptions
from geniex.engine.prompt_reader import READ_MIN, read_plan
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import LoadOptions, Session
from geniex.errors import UsageError
from geniex.engine.session import load_options
from geniex.llama import kv_state
from geniex.llama.kv import common_prefix


# -- model-free -----------------------------------------------------------------------
@pytest.mark.parametrize("size", [512, 100, 64])
@pytest.mark.parametrize("start,end", [(0, 1), (0, 63), (0, 64), (0, 65), (0, 511), (0, 512), (0, 513), (0, 575),
                                       (10, 1700), (100, 164), (3, 1027), (0, 1177), (0, 2048), (2000, 2010),
                                       (1990, 2040), (2040, 2047)])
def test_a_read_plan_never_calls_under_the_tile_and_covers_the_range(start, end, size):
    room = 2048
    first, chunks, pad = read_plan(start, end, room, size)
    assert first <= start and chunks[0][0] == first and sum(n for _, n in chunks) == end - first
    assert all(pos + n == nxt for (pos, n), (nxt, _) in zip(chunks, chunks[1:]))
    assert all(n + (pad if i == len(chunks) - 1 else 0) >= READ_MIN for i, (_, n) in enumerate(chunks))
    assert all(n <= max(size, 2 * READ_MIN - 1) for _, n in chunks)
    assert end + pad <= room
    assert first == start or pad == 0                    # placeholders where there is room, else read earlier
    assert read_plan(end, end, room) == (end, [], 0)


def sylvester(n):
    h = np.array([[1.0]])
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


@pytest.mark.parametrize("n", [16, 64])
def test_hadamard_is_the_normalized_sylvester_matrix_and_does_not_depend_on_the_rows_turned(n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 3 * n)).astype(np.float32)
    turned = kv_state.hadamard(x.copy(), n)
    want = (x.reshape(-1, n).astype(np.float64) @ sylvester(n)).reshape(50, -1)
    assert np.abs(turned - want).max() < 1e-5
    one_by_one = np.concatenate([kv_state.hadamard(x[i:i + 1].copy(), n) for i in range(50)])
    assert np.array_equal(one_by_one, turned)        # bitwise: a row's cells do not depend on its company


def test_parse_refuses_what_is_not_a_plain_kv_cache():
    with pytest.raises(kv_state.StateFormatError):
        kv_state.parse(b"\0" * 4)
    with pytest.raises(kv_state.StateFormatError, match="no cells"):
        kv_state.parse(bytes(8) + (1).to_bytes(4, "little") + bytes(4))
    with pytest.raises(kv_state.StateFormatError, match="bytes after"):
        kv_state.parse(bytes(8) + (1).to_bytes(4, "little") + bytes(4) + b"extra")


def test_prompt_kv_takes_f16_or_none():
    assert load_options({}).prompt_kv == "f16"
    assert load_options({"prompt_kv": "NONE"}).prompt_kv == "none"
    with pytest.raises(UsageError, match="--prompt-kv q8_0: expected one of f16, none"):
        load_options({"prompt_kv": "q8_0"})


# -- the demo model -------------------------------------------------------------------
@pytest.fixture(scope="module")
def session(demo_model):
    s = Session(demo_model, LoadOptions(nctx=2048))
    yield s
    s.close()


def text_of(n_lines, seed=0):
    return "".join(f"def load_{i}(request, answer):\n    x = read(token, {(i * 7 + seed) % 13})\n"
                   f"    return slot_{(i + seed) % 5}\n" for i in range(n_lines))


def chat(session, content):
    return session.tokenize_prompt(f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n")


def answer(session, tokens, n=16, **kw):
    gen = session.generate(tokens, GenOptions(max_tokens=n, sampling=SamplingParams(**kw)))
    out = [t for step in gen for t in step.committed]
    return out, gen.stats


def test_the_default_load_reads_prompts_in_f16_and_short_ones_on_the_target(session):
    assert session.reader is not None and session.reader_note is None
    reads, rows = session.reader.reads, session.reader.rows
    session.reset()
    hi = chat(session, "Hi")
    assert len(hi) < READ_MIN
    a, stats = answer(session, hi, n=8)
    assert session.reader.reads == reads and session.kv.converted == 0
    more = hi + a + chat(session, text_of(20))[1:]
    _, stats = answer(session, more)                       # past READ_MIN: read from the start
    assert session.reader.reads == reads + 1 and session.reader.rows == rows + len(more) - 1
    assert stats.prompt_reused == 0 and session.kv.converted == len(more) - 1
    again = more + chat(session, "Why?")[1:]
    _, stats = answer(session, again)                      # a short new turn: a call filled up to a tile
    assert session.reader.reads == reads + 2 and stats.prompt_reused == len(more) - 1


def test_an_answer_does_not_depend_on_what_the_cache_held(session):
    # A conversation that comes back (its last answer and a new turn after a prompt that
    # was read), a short one that grows past READ_MIN, and one that shrinks: each answer
    # equals the same prompt answered from an empty cache, greedy and seeded.
    first = chat(session, text_of(8) + "Which function returns slot_2?")
    for kw in ({}, {"temperature": 0.8, "top_k": 40, "seed": 5}):
        session.reset()
        a, _ = answer(session, first, **kw)
        back = first + a + chat(session, "And which reads token 3? " + text_of(2, seed=4))[1:]
        warm, stats = answer(session, back, **kw)
        assert stats.prompt_reused == len(first) - 1          # read again from its last prompt's end
        session.reset()
        assert answer(session, back, **kw)[0] == warm
    short = chat(session, "Count to three.")
    session.reset()
    s, _ = answer(session, short, n=8)
    grown = short + s + chat(session, text_of(6))[1:]
    warm, _ = answer(session, grown)
    session.reset()
    assert answer(session, grown)[0] == warm
    shrunk = grown[:len(short) + 5]
    warm, _ = answer(session, shrunk)                 # most of it held, its tail read again
    session.reset()
    assert answer(session, shrunk)[0] == warm


def test_the_cells_do_not_depend_on_how_the_read_is_cut(session):
    prompt = chat(session, text_of(12))
    assert len(prompt) > 300
    outs, states = [], []
    for chunk in (512, 64, 100):
        session.reset()
        session.reader.chunk = chunk
        try:
            outs.append(answer(session, prompt, n=8)[0])
        finally:
            session.reader.chunk = prompt_reader.READ_CHUNK
        states.append(session.ctx.save_state())
    assert outs[0] == outs[1] == outs[2]
    assert states[0] == states[1] == states[2]


def test_read_answers_are_close_to_the_target_reading_alone(session, demo_model):
    # The cells differ from the target's own by F16 rounding before quantization, so the
    # two loads' answers agree as long as no near-tie is met: the first tokens here.
    prompt = chat(session, text_of(12) + "Name one function.")
    session.reset()
    read, _ = answer(session, prompt, n=6)
    direct = Session(demo_model, LoadOptions(nctx=2048, prompt_kv="none"))
    try:
        assert direct.reader is None
        assert answer(direct, prompt, n=6)[0] == read
    finally:
        direct.close()


def test_a_conversation_back_from_the_prompt_cache_answers_as_fresh(demo_model):
    s = Session(demo_model, LoadOptions(nctx=2048, cache_ram=256 << 20))
    try:
        a_prompt, b_prompt = chat(s, text_of(6, seed=1)), chat(s, text_of(6, seed=2))
        s.adopt(a_prompt, owner="A")
        a, _ = answer(s, a_prompt)
        s.adopt(b_prompt, owner="B")                      # A's conversation goes to the cache
        answer(s, b_prompt)
        back = a_prompt + a + chat(s, "More, please.")[1:]
        s.adopt(back, owner="A")
        assert s.prompt_cache.hits == 1 and s.kv.read
        warm, stats = answer(s, back)
        assert stats.prompt_reused >= len(a_prompt) - READ_MIN
        s.reset()
        assert answer(s, back)[0] == warm
    finally:
        s.close()


def test_cells_that_do_not_match_the_target_turn_the_reader_off(demo_model, monkeypatch, tmp_path):
    # Cells that skip the target's rotation (the library itself refuses a state that says
    # so) make other logits: the load says so and decodes prompts on the target; the
    # verdict is kept, and the next load takes it without checking again.
    monkeypatch.setattr(kv_state, "hadamard", lambda x, n: x)
    for _ in range(2):
        s = Session(demo_model, LoadOptions(nctx=1024, data_dir=tmp_path))
        try:
            assert s.reader is None and "do not give the target's own logits" in s.reader_note
            assert answer(s, chat(s, text_of(5)), n=4)[0]
        finally:
            s.close()


def test_a_load_after_the_check_passed_makes_the_f16_cache_on_its_first_read(demo_model, tmp_path, monkeypatch):
    first = Session(demo_model, LoadOptions(nctx=1024, data_dir=tmp_path))
    prompt = chat(first, text_of(6))
    want = answer(first, prompt)[0]
    first.close()
    monkeypatch.setattr(prompt_reader.PromptReader, "calibrate", None)     # not called again
    s = Session(demo_model, LoadOptions(nctx=1024, data_dir=tmp_path))
    try:
        assert s.reader is not None and s.reader._ctx is None
        assert answer(s, prompt)[0] == want and s.reader._ctx is not None
    finally:
        s.close()


def test_targets_without_a_plain_kv_cache_decode_prompts_themselves(tiny):
    target, _ = tiny["pair"]                        # Gemma-4: sliding-window layers
    s = Session(target, LoadOptions(nctx=1024))
    try:
        assert s.reader is None and "sliding-window" in s.reader_note
    finally:
        s.close()


def test_a_short_context_reads_prompts_on_the_target(demo_model):
    s = Session(demo_model, LoadOptions(nctx=prompt_reader.READ_FROM_CTX))
    try:
        assert s.reader is None and "at most 1.3x faster" in s.reader_note
    finally:
        s.close()


def test_a_slot_reads_its_answer_while_another_answers_so_a_returning_turn_reads_only_what_is_new(demo_model):
    s = Session(demo_model, LoadOptions(nctx=1024, parallel=2, cache_ram=1 << 28))
    try:
        first = chat(s, text_of(20) + "Which function returns slot_1?")
        assert len(first) > prompt_reader.CATCH_UP_FROM
        with s.seat(first, "A") as seated:
            seated.adopt(first, "A")
            a, _ = answer(seated, first)
        back = first + a + chat(s, "And slot_3?")[1:]
        slot = s.slots.slots[0]
        other = chat(s, "Name three colours.")
        # Agents take turns: B is in the middle of its answer (its rows wanted by every
        # shared decode) while A's slot reads A's last answer; B's answer is its own.
        with s.seat(other, "B") as seated:
            assert seated.slot is not slot
            seated.adopt(other, "B")
            steps = iter(seated.generate(other, GenOptions(max_tokens=12, sampling=SamplingParams())))
            b = list(next(steps).committed)
            deadline = time.monotonic() + 30
            while slot.kv.converted < len(slot.kv.tokens) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert slot.kv.converted == len(slot.kv.tokens) > len(first)      # read while B answers
            b += [t for step in steps for t in step.committed]
        # ... and kept in the prompt cache then, so that giving the slot up later costs nothing.
        deadline = time.monotonic() + 30
        while s.prompt_cache.saved == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        saved, held = s.prompt_cache.saved, list(slot.kv.tokens)
        assert saved == 1 and [e.tokens for e in s.prompt_cache._entries.values()] == [held]
        with s.prompt_cache.lock:
            s.prompt_cache.save(slot.kv, "A")
        assert s.prompt_cache.saved == saved and len(s.prompt_cache._entries) == 1
        with s.seat(back, "A") as seated:
            held = list(seated.slot.kv.tokens)
            assert seated.slot is slot and len(held) > len(first) and seated.slot.kv.converted == len(held)
            seated.adopt(back, "A")
            warm, stats = answer(seated, back)
        assert stats.prompt_reused == common_prefix(held, back) >= len(first)
        s.reset()
        with s.seat(back, "A") as seated:
            seated.adopt(back, "A")
            assert answer(seated, back)[0] == warm
        with s.seat(other, "B") as seated:
            seated.adopt(other, "B")
            assert answer(seated, other, n=12)[0] == b
    finally:
        s.close()
