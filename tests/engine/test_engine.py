"""The engine on the real demo model: tokens, template, sampling, stop reasons, reuse."""
import pytest
import tiny_gemma4

from geniex.engine.chat import Conversation
from geniex.engine.loop import GenOptions
from geniex.engine.session import LoadOptions, Session
from geniex.engine.sampling import SamplingParams
from geniex.engine.text import TextStream
from geniex.errors import ContextLengthExceeded, GenieXError


@pytest.fixture(scope="module")
def session(demo_model):
    s = Session(demo_model, LoadOptions(nctx=1024))
    yield s
    s.close()


# A raw prompt the demo model continues without ever ending on its own.
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"


def greedy(**kw):
    return GenOptions(sampling=SamplingParams(), **kw)


def test_tokenize_round_trip(session):
    text = "Speculative decoding: naïve café, 42 tokens — ok?"
    tokens = session.vocab.tokenize(text)
    assert len(tokens) > 5
    assert session.vocab.detokenize(tokens) == text


def test_greedy_capital_of_france_is_paris(session):
    session.reset()
    gen = session.generate(session.vocab.tokenize("The capital of France is"), greedy(max_tokens=4))
    assert gen.run().startswith(" Paris")
    assert gen.stats.stop_reason == "length" and gen.stats.decode_tokens == 4


def test_chat_template_is_applied(session):
    chat = Conversation(session, "Be brief.")
    assert chat.template.kind == "jinja"
    text = chat.template.render(chat.messages + [{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n")
    # Without a system message, SmolLM2's own template adds its default one.
    text = chat.template.render([{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_eos_stop_and_conversation_reuses_kv(session):
    session.reset()
    chat = Conversation(session)
    g1 = chat.ask("What is the capital of France? Answer in one word.", greedy(max_tokens=64))
    g1.run()
    chat.finish(g1)
    assert g1.stats.stop_reason == "eos" and g1.stats.prompt_reused == 0
    g2 = chat.ask("And of Italy?", greedy(max_tokens=64))
    g2.run()
    # The second turn decodes only what follows the cached conversation.
    assert g2.stats.prompt_reused > g1.stats.prompt_tokens - 2
    assert g2.stats.prompt_tokens > g2.stats.prompt_reused


def test_prompts_decode_in_512_row_micro_batches(session, demo_model):
    """With the default q8_0 cache the context decodes in 512-row micro-batches
    (llama.cpp's pace; an F16 cache keeps 32, under the size where its kernels change).
    That a returning turn answers as a cold one: tests/engine/test_prompt_reader.py."""
    assert session.ctx.n_ubatch == 512 and session.reader.ctx.n_ubatch == 512
    f16 = Session(demo_model, LoadOptions(nctx=256, cache_type_k="f16", cache_type_v="f16"))
    assert f16.ctx.n_ubatch == 32 and f16.reader is None
    f16.close()


def test_stop_sequence_is_not_emitted(session):
    session.reset()
    full = session.generate(session.vocab.tokenize("The capital of France is"), greedy(max_tokens=12)).run()
    assert "." in full
    session.reset()
    gen = session.generate(session.vocab.tokenize("The capital of France is"), greedy(max_tokens=12, stop=(".",)))
    text = gen.run()
    assert gen.stats.stop_reason == "stop_sequence"
    assert text == full[:full.index(".")]


def test_context_length_stop_and_prompt_too_long(tmp_path):
    # Any model does: a tiny generated one (tests/support/tiny_gemma4.py) whose
    # end-of-sequence row is zeroed, so only the context can stop it.
    model = tiny_gemma4.write_target(tmp_path / "tiny.gguf", eos_boost=0.0)
    s = Session(model, LoadOptions(nctx=24))
    try:
        n_ctx = s.ctx.n_ctx          # llama.cpp rounds the context up (to 256 here)
        # A counting prompt that leaves 8 cells: the context fills after a prefill (one
        # batched decode) and a few one-row steps, not hundreds of them.
        counting = ", ".join(str(i) for i in range(1, 400)) + ","
        tokens = s.vocab.tokenize(counting)[:n_ctx - 8]
        gen = s.generate(tokens, greedy(max_tokens=1000))
        gen.run()
        assert gen.stats.stop_reason == "context_length"
        # The prompt and every answer token but the last fill the context exactly.
        assert len(tokens) + gen.stats.decode_tokens - 1 == n_ctx
        with pytest.raises(ContextLengthExceeded):
            s.generate(list(tokens) * 2, greedy()).run()
    finally:
        s.close()


def test_user_cancel_stops_between_steps(session):
    session.reset()
    calls = {"n": 0}

    def cancel():
        calls["n"] += 1
        return calls["n"] > 5

    gen = session.generate(session.vocab.tokenize(COUNTING), greedy(max_tokens=100), cancel=cancel)
    gen.run()
    # One check before the prompt's only prefill chunk, then one before each step.
    assert gen.stats.stop_reason == "user" and gen.stats.decode_tokens == 4


def test_seeded_sampling_is_reproducible(session):
    def sample(seed):
        session.reset()
        opts = GenOptions(max_tokens=16, sampling=SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=seed))
        gen = session.generate(session.vocab.tokenize("Once upon a time"), opts)
        gen.run()
        return gen.tokens

    a, b, c = sample(42), sample(42), sample(7)
    assert a == b
    assert a != c


def test_penalties_change_greedy_output(session):
    def run(**kw):
        session.reset()
        gen = session.generate(session.vocab.tokenize("One, one, one, one, one,"),
                               GenOptions(max_tokens=8, sampling=SamplingParams(**kw)))
        gen.run()
        return gen.tokens

    # (8 tokens: each penalty changes the answer's first token already; was 20)
    plain = run()
    assert run(repetition_penalty=1.5) != plain
    assert run(presence_penalty=2.0, frequency_penalty=1.0) != plain


def test_text_stream_never_splits_utf8_or_prints_stops():
    s = TextStream(stops=("END",))
    out = [s.feed("caf".encode()), s.feed(b"\xc3"), s.feed(b"\xa9 E"), s.feed(b"N"), s.feed(b"D more")]
    assert out == ["caf", "", "é ", "", ""] and s.stopped
    s = TextStream(stops=("END",))
    assert s.feed(b"EN") == "" and s.feed(b"d") == "ENd"


def test_nctx_must_be_positive(demo_model):
    with pytest.raises(GenieXError, match="--nctx"):
        Session(demo_model, LoadOptions(nctx=0))
