"""Constrained answers are exact under speculation (issue #17): with every drafting
method, with and without forced-token drafts, greedy and seeded, a constrained answer is
plain constrained decoding (no drafts at all) token for token, past position 1,024.

The demo model continues a JSON inventory under a JSON schema (keys, punctuation and
enums the grammar forces; numbers and names it leaves to the model), as the identity
tests of tests/speculative/test_identity_long.py do for free text; draft-mtp runs on the
tiny Gemma-4 pairs with a Q8_0 target (exact for seeded sampling, see test_mtp.py).
"""
import json

import pytest

from geniex.engine.constraints import Grammar
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import LoadOptions, Session
from geniex.speculative.options import SpecOptions
from test_mtp import q8_copy

METHODS = ["ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "draft-simple"]
SAMPLINGS = {"greedy": SamplingParams(), "seeded": SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=77)}
ANSWER = 64
ITEM = {"type": "object", "additionalProperties": False,
        "required": ["item", "color", "weight", "shelf", "checked_by"],
        "properties": {"item": {"type": "integer"}, "color": {"enum": ["red", "blue", "green"]},
                       "weight": {"type": "integer"}, "shelf": {"type": "integer"},
                       "checked_by": {"type": "string", "maxLength": 8}}}
SCHEMA = {"type": "array", "items": ITEM}
GRAMMAR = Grammar.parse("json_schema", SCHEMA)


def inventory_prompt(session, n_tokens):
    """About ``n_tokens`` of a JSON inventory to continue (the n-gram methods find drafts
    in it, and the grammar forces its keys)."""
    items, i = [], 0
    while True:
        items.append({"item": i, "color": ["red", "blue", "green"][i % 3], "weight": i * 7 % 23,
                      "shelf": i % 5, "checked_by": ["Ann", "Bob", "Eve", "Tom"][i % 4]})
        i += 1
        text = "Continue this inventory, as a JSON array of the same objects:\n" + json.dumps(items)
        tokens = session.tokenize_prompt(text + "\n")
        if len(tokens) >= n_tokens:
            return tokens


def answer(session, tokens, sampling, speculative=True, forced=True, grammar=GRAMMAR, max_tokens=ANSWER):
    # The KV cache keeps the prompt from the session's last answer (the same bits a new
    # prefill would write): only the answer is decoded again.
    gen = session.generate(tokens, GenOptions(max_tokens=max_tokens, sampling=sampling, grammar=grammar,
                                              forced_drafts=forced), speculative=speculative)
    steps = list(gen)
    return gen.tokens, gen.stats, steps


@pytest.fixture(scope="module")
def plain(demo_model):
    s = Session(demo_model, LoadOptions(nctx=2048))
    yield s
    s.close()


@pytest.fixture(scope="module")
def prompt(plain):
    return inventory_prompt(plain, 1000)


@pytest.fixture(scope="module")
def reference(plain, prompt):
    """Plain constrained decoding: no drafter, no forced drafts."""
    out = {}
    for sname, sampling in SAMPLINGS.items():
        tokens, stats, _ = answer(plain, prompt, sampling, speculative=False)
        assert stats.drafted == 0 and len(prompt) + len(tokens) > 1024
        out[sname] = tokens
    return out


def check(tokens, want, where):
    first = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), None)
    assert tokens == want, f"{where}: differs from plain constrained decoding at answer token {first}"


@pytest.fixture(scope="module", params=METHODS)
def spec_session(request, demo_model):
    method = request.param
    so = SpecOptions(types=(method,), draft_model="demo", draft_path=demo_model if method == "draft-simple" else None,
                     n_max=6, policy="fixed")
    s = Session(demo_model, LoadOptions(nctx=2048, spec=so))
    assert s.speculative, s.spec_notes
    yield method, s
    s.close()


@pytest.mark.parametrize("forced", [True, False], ids=["forced", "no-forced"])
@pytest.mark.parametrize("sname", SAMPLINGS)
def test_every_method_is_plain_constrained_decoding(spec_session, prompt, reference, sname, forced):
    method, session = spec_session
    tokens, stats, steps = answer(session, prompt, SAMPLINGS[sname], forced=forced)
    check(tokens, reference[sname], f"{method}, {sname}, forced drafts {forced}")
    methods = {s.method for s in steps if s.drafted}
    assert stats.drafted > 0, "nothing was drafted: the test would prove nothing"
    if forced:
        assert any(m.startswith("forced") for m in methods), methods
    else:
        assert not any(m.startswith("forced") for m in methods), methods


@pytest.mark.parametrize("sname", SAMPLINGS)
def test_forced_drafts_alone_are_plain_constrained_decoding(plain, prompt, reference, sname):
    """A session with no drafter: the forced runs are the only drafts."""
    tokens, stats, steps = answer(plain, prompt, SAMPLINGS[sname])
    check(tokens, reference[sname], f"forced drafts alone, {sname}")
    assert {s.method for s in steps if s.drafted} == {"forced"}
    # The schema forces most of an inventory's bytes: most steps commit several tokens.
    assert stats.accepted > 0.3 * len(tokens) and stats.steps < len(tokens)


def test_a_complete_grammar_ends_the_answer_the_same_way(plain, demo_model):
    """An answer that completes its grammar before the length limit (EOS forced), plain
    and with forced drafts: one answer."""
    shelf = {"type": "object", "additionalProperties": False, "required": ["color", "shelf"],
             "properties": {"color": {"enum": ["red", "blue", "green"]},
                            "shelf": {"type": "integer", "minimum": 0, "maximum": 9}}}
    three = Grammar.parse("json_schema", {"type": "array", "minItems": 2, "maxItems": 2, "items": shelf})
    tokens = plain.tokenize_prompt("Two boxes and their shelves as JSON:")
    want, stats, _ = answer(plain, tokens, SAMPLINGS["greedy"], speculative=False, grammar=three, max_tokens=200)
    assert stats.stop_reason == "eos" and len(json.loads(plain.vocab.detokenize(want))) == 2
    got, stats, _ = answer(plain, tokens, SAMPLINGS["greedy"], grammar=three, max_tokens=200)
    check(got, want, "forced drafts")
    assert stats.stop_reason == "eos"


@pytest.fixture(scope="module")
def q8_pair(tiny, tmp_path_factory):
    target, draft = tiny["aligned"]
    return q8_copy(target, tmp_path_factory.mktemp("q8c") / "aligned-target-q8.gguf"), draft


@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (0.8, 1), (1.0, 3)])
def test_draft_mtp_is_plain_constrained_decoding(q8_pair, temperature, seed):
    """The tiny Gemma-4 pair (its 256-token vocabulary: a grammar of its words)."""
    target, draft = q8_pair
    plain = Session(target, LoadOptions(nctx=512))
    spec = Session(target, LoadOptions(nctx=512, spec=SpecOptions(types=("draft-mtp",), draft_model=str(draft),
                                                                 draft_path=draft, policy="fixed")))
    try:
        assert spec.speculative, spec.spec_notes
        grammar = Grammar.parse("gbnf", 'root ::= ("the cat " | "sat on " | "a mat " | [a-z ])+')
        tokens = plain.tokenize_prompt("the cat sat on a mat while he thinks of rain " * 4)
        sampling = SamplingParams(temperature=temperature, seed=seed)
        want, _, _ = answer(plain, tokens, sampling, speculative=False, grammar=grammar, max_tokens=100)
        for forced in (True, False):
            got, stats, _ = answer(spec, tokens, sampling, grammar=grammar, forced=forced, max_tokens=100)
            check(got, want, f"draft-mtp, temperature {temperature}, forced drafts {forced}")
            assert stats.drafted > 0
    finally:
        spec.close()
        plain.close()
