"""The constraint API on the demo model's real vocabulary: masks, consuming, rollback,
forced tokens, and grammar errors that name their field."""
import json

import numpy as np
import pytest

from geniex.engine.constraints import Grammar, GrammarError
from geniex.llama.objects import Model

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def vocab(demo_model):
    model = Model(demo_model)
    yield model.vocab
    model.close()


@pytest.mark.fast
@pytest.mark.parametrize("kind,source,words", [
    ("gbnf", 'root ::= "yes" | foo', "foo"),
    ("json_schema", '{"type": "objectx"}', "objectx"),
    ("json_schema", "{not json", "not valid JSON"),
    ("json_schema", "[1, 2]", "must be an object"),
    ("regex", "[a-z", "unclosed character class"),
    ("lark", "start: nothing_here", "nothing_here"),
    ("gbnf", "", "non-empty"),
])
def test_bad_grammar_is_a_usage_error_naming_the_field(kind, source, words):
    with pytest.raises(GrammarError) as e:
        Grammar.parse(kind, source, param="grammar_field")
    assert e.value.param == "grammar_field" and e.value.exit_code == 2
    assert str(e.value).startswith("grammar_field: ") and words in str(e.value)


@pytest.mark.fast
def test_grammars_compare_by_compiled_text_and_pickle():
    import pickle
    a = Grammar.parse("json_schema", json.dumps(PERSON))
    b = Grammar.parse("json_schema", PERSON)
    assert a == b and hash(a) == hash(b)
    assert pickle.loads(pickle.dumps(a)) == a
    assert a != Grammar.parse("json_object")


def test_mask_allows_only_what_the_grammar_allows(vocab):
    c = Grammar.parse("gbnf", 'root ::= "yes" | "no"').constraint(vocab)
    row = c.mask(np.zeros(vocab.n_tokens, dtype=np.float32))
    allowed = set(np.nonzero(np.isfinite(row))[0].tolist())
    texts = {vocab.piece(t) for t in allowed}
    assert allowed and all(b"yes".startswith(t) or b"no".startswith(t) for t in texts)
    assert vocab.tokenize("yes")[0] in allowed and not c.is_accepting()
    for t in vocab.tokenize("yes"):
        assert c.consume(t)
    assert c.is_accepting() and c.is_stopped()
    # Only end tokens remain.
    after = set(np.nonzero(c.allowed())[0].tolist())
    assert after and after <= vocab.eog


def test_forced_tokens_consume_and_rollback(vocab):
    c = Grammar.parse("json_schema", PERSON).constraint(vocab)
    forced = c.forced_tokens()
    assert vocab.detokenize(forced) == '{"name'
    assert c.forced_text() == b'{"name":"'
    rest = vocab.tokenize('{"name":"Bob","age":3}')
    assert c.allowed_prefix(rest) == len(rest)
    assert c.allowed_prefix(vocab.tokenize('{"nope"')) < len(vocab.tokenize('{"nope"'))
    for t in rest:
        assert c.consume(t)
    assert c.is_accepting()
    c.rollback(len(rest) - len(forced))
    assert not c.is_accepting()                          # back where the forced run ended
    assert c.allowed_prefix(rest[len(forced):]) == len(rest) - len(forced)
    assert not c.consume(vocab.tokenize("x")[0])          # not allowed: the matcher reports it
    assert c.error()
