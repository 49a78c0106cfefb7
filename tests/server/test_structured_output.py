"""Constrained decoding over HTTP (issue #17): every constraint field on every decoding
route gives schema-valid JSON or grammar-matching text, bad grammars are a 400 naming
the field, ``grammar_path`` resolves only inside ``serve --grammar-dir``, and the
OpenAI SDK's ``chat.completions.parse`` returns a parsed Pydantic object.

One in-process server (create_app on a loopback port) on the demo model, with a store
that also holds the demo copy declaring FIM tokens (for /infill).
"""
import io
import json
import re

import jsonschema
import pytest

from demo_variants import demo_with_pooling_and_fim
from geniex.store import Store
from serverproc import AppServer, DEMO, calibrate_as, ok, seed_calibration

VARIANT = "test/demo-embed-fim:Q4_1"
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0,
                                                                              "maximum": 150}}}
YES_NO = 'root ::= "yes" | "no"'
ASK = [{"role": "user", "content": "Describe Bob, who is 42 years old, as JSON."}]
PROMPT = "Bob is 42 years old. As JSON:"


@pytest.fixture(scope="module")
def grammar_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("grammars")
    (root / "yesno.gbnf").write_text(YES_NO)
    (root / "nested").mkdir()
    (root / "nested" / "digits.gbnf").write_text('root ::= [0-9] [0-9] [0-9]')
    (root.parent / "outside.gbnf").write_text(YES_NO)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_model, grammar_dir, calibration_cache):
    from geniex.server.placement import Defaults
    data = tmp_path_factory.mktemp("structured")
    variant = demo_with_pooling_and_fim(demo_model, tmp_path_factory.mktemp("variant") / "demo-embed-fim.Q4_1.gguf")
    stored = Store(data).pull(VARIANT, local_path=variant, out=io.StringIO(), interactive=False)
    # The stored variant has the demo model's curves (its tensors): its load measures none.
    seed_calibration(data)
    calibrate_as(data / "calibration.json", stored.path, demo_model)
    with AppServer(data, model=DEMO, defaults=Defaults(nctx=1024, grammar_dir=str(grammar_dir))) as s:
        yield s


def error_400(r, param):
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param.split(".")[0]), err
    return err


# Most answers here are to one of two prompts (ASK rendered by the chat template, PROMPT
# raw), under one constraint or another: each request keeps the KV cache of the one
# before (``GenieX-KeepCache``) and decodes only what its prompt does not share with it,
# instead of prefilling the same prompt again (a continued prefix gives the tokens a fresh
# prefill does; what these tests check is the constraint on the answer). The route is the
# outer parameter of the tests below, so one route's prompt serves its fields in a row.
KEEP = {"GenieX-KeepCache": "true"}


def _answer(server, route, fields, max_tokens=60, ask=ASK, prompt=PROMPT):
    """The text a route answers with ``fields`` added to a plain request."""
    post = lambda body: ok(server.post(route, body, headers=KEEP))       # noqa: E731
    if route == "/v1/chat/completions":
        return post({"messages": ask, "max_tokens": max_tokens, **fields})["choices"][0]["message"]["content"]
    if route == "/v1/completions":
        return post({"prompt": prompt, "max_tokens": max_tokens, **fields})["choices"][0]["text"]
    if route == "/completion":
        return post({"prompt": prompt, "n_predict": max_tokens, **fields})["content"]
    if route == "/infill":
        return post({"model": VARIANT, "input_prefix": prompt, "input_suffix": "\n", "n_predict": max_tokens,
                     **fields})["content"]
    raise AssertionError(route)


ROUTES = ["/v1/chat/completions", "/v1/completions", "/completion",
          # /infill answers with the FIM variant: its tests run together after the demo
          # model's (tests/server/conftest.py), one load, not two per /infill test.
          pytest.param("/infill", marks=pytest.mark.resident("variant"))]
SCHEMA_FIELDS = {
    "response_format json_schema": {"response_format": {"type": "json_schema",
                                                        "json_schema": {"name": "person", "schema": PERSON,
                                                                        "strict": True}}},
    "response_format json_object+schema": {"response_format": {"type": "json_object", "schema": PERSON}},
    "json_schema": {"json_schema": PERSON},
}
GRAMMAR_FIELDS = {
    "grammar": {"grammar": YES_NO},
    "grammar_string": {"grammar_string": YES_NO},
    "grammar_path": {"grammar_path": "yesno.gbnf"},
}


@pytest.mark.parametrize("name", list(SCHEMA_FIELDS))
@pytest.mark.parametrize("route", ROUTES)
def test_schema_fields_give_schema_valid_json(server, route, name):
    text = _answer(server, route, SCHEMA_FIELDS[name])
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("route", ROUTES[:3])     # /infill: covered by the schema and grammar tests
def test_json_object_gives_a_json_object(server, route):
    text = _answer(server, route, {"response_format": {"type": "json_object"}}, max_tokens=200,
                   ask=[{"role": "user", "content": 'What is 2+2? Answer as a JSON object like {"answer": ...}.'}],
                   prompt='2+2 as a JSON object like {"answer": 4}:')
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("name", list(GRAMMAR_FIELDS))
@pytest.mark.parametrize("route", ROUTES)
def test_grammar_fields_give_matching_text(server, route, name):
    assert _answer(server, route, GRAMMAR_FIELDS[name]) in ("yes", "no")


def test_grammar_path_in_a_subfolder_and_seeded_sampling(server):
    for seed in (1, 2, 3):
        text = _answer(server, "/v1/chat/completions", {"grammar_path": "nested/digits.gbnf", "temperature": 1.0,
                                                        "seed": seed})
        assert re.fullmatch(r"[0-9]{3}", text), text


def test_response_format_text_is_free_text(server):
    free = _answer(server, "/v1/chat/completions", {}, max_tokens=8)
    assert _answer(server, "/v1/chat/completions", {"response_format": {"type": "text"}}, max_tokens=8) == free


def test_a_stream_under_a_schema_is_schema_valid(server):
    schema = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    events = server.stream("/v1/chat/completions", {"messages": ASK, "max_tokens": 60, "response_format": schema},
                           headers=KEEP)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    jsonschema.validate(json.loads(text), PERSON)
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices")][-1] == "stop"


def test_responses_text_format(server):
    body = ok(server.post("/v1/responses", {"input": ASK[0]["content"], "max_output_tokens": 60,
                                            "text": {"format": {"type": "json_schema", "name": "person",
                                                                "schema": PERSON, "strict": True}}}, headers=KEEP))
    jsonschema.validate(json.loads(body["output"][0]["content"][0]["text"]), PERSON)
    assert body["text"]["format"]["type"] == "json_schema"
    body = ok(server.post("/v1/responses", {"input": 'What is 2+2? Answer as a JSON object like {"answer": ...}.',
                                            "max_output_tokens": 200, "text": {"format": {"type": "json_object"}}},
                              headers=KEEP))
    assert isinstance(json.loads(body["output"][0]["content"][0]["text"]), dict)
    error_400(server.post("/v1/responses", {"input": "hi", "text": {"format": {"type": "xml"}}}), "text.format.type")


def test_messages_output_format(server):
    body = ok(server.post("/v1/messages", {"max_tokens": 60, "messages": ASK,
                                           "output_format": {"type": "json_schema", "schema": PERSON}}, headers=KEEP))
    jsonschema.validate(json.loads(body["content"][0]["text"]), PERSON)
    error_400(server.post("/v1/messages", {"max_tokens": 8, "messages": ASK, "output_format": {"type": "yaml"}}),
              "output_format")


@pytest.mark.parametrize("fields, param", [
    ({"grammar": "root ::= nothing"}, "grammar"),
    ({"grammar_string": "root ::= \"a"}, "grammar_string"),
    ({"grammar_string": 7}, "grammar_string"),
    ({"json_schema": {"type": "objectx"}}, "json_schema"),
    ({"json_schema": "not a schema"}, "json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 3}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_object", "schema": {"type": "nope"}}}, "response_format.schema"),
    ({"grammar": YES_NO, "json_schema": PERSON}, "json_schema"),
    ({"grammar_path": "missing.gbnf"}, "grammar_path"),
])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/completion"])
def test_bad_constraints_are_a_400_naming_the_field(server, route, fields, param):
    body = {"messages": ASK} if route == "/v1/chat/completions" else {"prompt": PROMPT}
    error_400(server.post(route, {**body, "max_tokens": 4, **fields}), param)


@pytest.mark.parametrize("path", ["../outside.gbnf", "/etc/passwd", "nested/../../outside.gbnf", "."])
def test_grammar_path_outside_the_folder_is_a_400(server, path):
    err = error_400(server.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 4, "grammar_path": path}),
                    "grammar_path")
    assert "outside" in err["message"] or "no grammar file" in err["message"]


def test_grammar_path_without_a_grammar_folder_is_a_400(tmp_path):
    with AppServer(tmp_path, model=DEMO) as s:
        err = error_400(s.post("/v1/chat/completions", {"messages": ASK, "max_tokens": 4,
                                                        "grammar_path": "yesno.gbnf"}), "grammar_path")
        assert "--grammar-dir" in err["message"]


def test_openai_sdk_parse_returns_a_pydantic_object_ten_of_ten(server):
    import openai
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=16)
        age: int = Field(ge=0, le=150)
        city: str = Field(max_length=24)

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    parsed = []
    for seed in range(1, 11):
        completion = client.chat.completions.parse(
            model=DEMO, messages=[{"role": "user", "content": "Invent a person: name, age and city."}],
            response_format=Person, temperature=0.7, seed=seed, max_tokens=80,
            extra_body={"cache_prompt": True})      # one prompt, ten answers: prefilled once
        person = completion.choices[0].message.parsed
        assert isinstance(person, Person), completion.choices[0].message.content
        parsed.append(person)
    assert len({p.model_dump_json() for p in parsed}) > 1        # seeded, not one fixed answer
