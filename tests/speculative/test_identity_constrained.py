"""Constrained answers are exact under speculation (issue #17): with every drafting
method, with and without forced-token drafts, greedy and seeded, a constrained answer is
plain constrained decoding (no drafts at all) token for token, past position 1,024.

The demo model continues the JSON inventory of tests/speculative/test_identity_long.py
under a JSON schema (keys, punctuation and enums the grammar forces; numbers and names it
leaves to the model), on the same identity bench (tests/support/identity.py): the prompt
is prefilled once for every method and both modules. draft-mtp runs on the tiny Gemma-4
pairs with a Q8_0 target (exact for seeded sampling, see test_mtp.py).
"""
import json

import pytest

from geniex.engine.constraints import Grammar
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import LoadOptions, Session
from geniex.speculative.options import SpecOptions
from identity import METHODS, SAMPLINGS, first_difference, gen_options
from test_mtp import q8_copy

# The identity of speculative output on every core (tests/support/parallel.py).
pytestmark = pytest.mark.all_cores

# Answers start 16 tokens before position 1,024 and run 16 past it: the n-gram methods
# need about that long to find a draft in a constrained answer (without forced drafts,
# ngram-map-k and ngram-cache drafted nothing in 20 greedy tokens from 1,020). The prompt
# is the start of the bench's past-1,024 one (reused from the KV cache).
START, ANSWER = 1024 - 16, 32
ITEM = {"type": "object", "additionalProperties": False,
        "required": ["item", "color", "weight", "shelf", "checked_by"],
        "properties": {"item": {"type": "integer"}, "color": {"enum": ["red", "blue", "green"]},
                       "weight": {"type": "integer"}, "shelf": {"type": "integer"},
                       "checked_by": {"type": "string", "maxLength": 8}}}
# At least two items: the answer runs its full length (an empty array is two tokens).
SCHEMA = {"type": "array", "items": ITEM, "minItems": 2}
GRAMMAR = Grammar.parse("json_schema", SCHEMA)


def answer(session, tokens, sampling, speculative=True, forced=True, grammar=GRAMMAR, max_tokens=ANSWER):
    # The KV cache keeps the prompt from the session's last answer (the same bits a new
    # prefill would write): only the answer is decoded again.
    gen = session.generate(tokens, GenOptions(max_tokens=max_tokens, sampling=sampling, grammar=grammar,
                                              forced_drafts=forced), speculative=speculative)
    steps = list(gen)
    return gen.tokens, gen.stats, steps


@pytest.fixture(scope="module")
def prompt(long_prompts):
    return long_prompts["past-1024"][:START]


def reference(bench, prompt, sname):
    """Plain constrained decoding: no drafter, no forced drafts."""
    gen = bench.reference(("constrained", sname), prompt, gen_options(ANSWER, sname, grammar=GRAMMAR))
    assert gen.stats.drafted == 0 and len(prompt) < 1024 < len(prompt) + len(gen.tokens)
    return gen.tokens


def check(tokens, want, where):
    first = first_difference(tokens, want)
    assert tokens == want, f"{where}: differs from plain constrained decoding at answer token {first}"


@pytest.mark.parametrize("forced", [True, False], ids=["forced", "no-forced"])
@pytest.mark.parametrize("sname", SAMPLINGS)
@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_plain_constrained_decoding(long_bench, prompt, method, sname, forced):
    want = reference(long_bench, prompt, sname)
    gen = long_bench.answer(method, prompt, gen_options(ANSWER, sname, grammar=GRAMMAR, forced_drafts=forced))
    check(gen.tokens, want, f"{method}, {sname}, forced drafts {forced}")
    methods = {s.method for s in gen.steps if s.drafted}
    assert gen.stats.drafted > 0, "nothing was drafted: the test would prove nothing"
    assert any(s.drafted and s.n_past + len(s.drafted) >= 1024 for s in gen.steps), "no draft verified past 1,024"
    if forced:
        assert any(m.startswith("forced") for m in methods), methods
    else:
        assert not any(m.startswith("forced") for m in methods), methods


@pytest.mark.parametrize("sname", SAMPLINGS)
def test_forced_drafts_alone_are_plain_constrained_decoding(long_bench, prompt, sname):
    """A session with no drafter: the forced runs are the only drafts."""
    want = reference(long_bench, prompt, sname)
    with long_bench.without_drafter() as session:
        tokens, stats, steps = answer(session, prompt, SAMPLINGS[sname])
    check(tokens, want, f"forced drafts alone, {sname}")
    assert {s.method for s in steps if s.drafted} == {"forced"}
    # The schema forces most of an inventory's bytes: most steps commit several tokens.
    assert stats.accepted > 0.3 * len(tokens) and stats.steps < len(tokens)


def test_a_complete_grammar_ends_the_answer_the_same_way(demo_model):
    """An answer that completes its grammar before the length limit (EOS forced), plain
    and with forced drafts: one answer. (A session of its own: another prompt on the
    bench's would make it prefill the inventory again.)"""
    shelf = {"type": "object", "additionalProperties": False, "required": ["color", "shelf"],
             "properties": {"color": {"enum": ["red", "blue", "green"]},
                            "shelf": {"type": "integer", "minimum": 0, "maximum": 9}}}
    three = Grammar.parse("json_schema", {"type": "array", "minItems": 2, "maxItems": 2, "items": shelf})
    plain = Session(demo_model, LoadOptions(nctx=256))
    try:
        tokens = plain.tokenize_prompt("Two boxes and their shelves as JSON:")
        want, stats, _ = answer(plain, tokens, SAMPLINGS["greedy"], speculative=False, grammar=three,
                                max_tokens=200)
        assert stats.stop_reason == "eos" and len(json.loads(plain.vocab.detokenize(want))) == 2
        got, stats, _ = answer(plain, tokens, SAMPLINGS["greedy"], grammar=three, max_tokens=200)
    finally:
        plain.close()
    check(got, want, "forced drafts")
    assert stats.stop_reason == "eos"


@pytest.fixture(scope="module")
def q8_pair(tiny, tmp_path_factory):
    target, draft = tiny["aligned"]
    return q8_copy(target, tmp_path_factory.mktemp("q8c") / "aligned-target-q8.gguf"), draft


@pytest.fixture(scope="module")
def mtp_sessions(q8_pair):
    """A plain and a draft-mtp session of the Q8_0 target, shared by the temperatures: each
    prefills the prompt once and every later answer reuses it from the KV cache (a session
    per temperature prefilled it six times)."""
    target, draft = q8_pair
    plain = Session(target, LoadOptions(nctx=512))
    spec = Session(target, LoadOptions(nctx=512, spec=SpecOptions(types=("draft-mtp",), draft_model=str(draft),
                                                                 draft_path=draft, policy="fixed")))
    yield plain, spec
    spec.close()
    plain.close()


@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (0.8, 1), (1.0, 3)])
def test_draft_mtp_is_plain_constrained_decoding(mtp_sessions, temperature, seed):
    """The tiny Gemma-4 pair (its 256-token vocabulary: a grammar of its words)."""
    plain, spec = mtp_sessions
    assert spec.speculative, spec.spec_notes
    grammar = Grammar.parse("gbnf", 'root ::= ("the cat " | "sat on " | "a mat " | [a-z ])+')
    tokens = plain.tokenize_prompt("the cat sat on a mat while he thinks of rain " * 4)
    sampling = SamplingParams(temperature=temperature, seed=seed)
    want, _, _ = answer(plain, tokens, sampling, speculative=False, grammar=grammar, max_tokens=100)
    for forced in (True, False):
        got, stats, _ = answer(spec, tokens, sampling, grammar=grammar, forced=forced, max_tokens=100)
        check(got, want, f"draft-mtp, temperature {temperature}, forced drafts {forced}")
        assert stats.drafted > 0
