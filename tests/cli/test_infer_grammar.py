"""`geniex infer --grammar-string/--grammar-path/--json-schema` as a subprocess (issue #17).

The grammar answers come from a tiny generated model (tests/support/tiny_gemma4.py): the
flags' way to the constraint is the same for any model, and its load, prefill and
256-token masks cost a fraction of the demo model's (the demo's 49k-token masks are
tests/engine/test_constraints.py's and the server's)."""
import json

import jsonschema
import pytest
import tiny_gemma4

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}}}


def answer(proc):
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tiny_gemma4.write_target(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def test_grammar_string_and_grammar_path(cli, tmp_path, tiny_model):
    out = answer(cli("infer", tiny_model, "-p", "Is the sky blue?", "--grammar-string", 'root ::= "yes" | "no"'))
    assert out in ("yes", "no")
    (tmp_path / "digits.gbnf").write_text('root ::= [0-9] [0-9] [0-9] "-" [0-9] [0-9]\n')
    out = answer(cli("infer", tiny_model, "-p", "Give me a code.", "--grammar-path", tmp_path / "digits.gbnf",
                     "--temperature", "0.9", "--seed", "4"))
    assert len(out) == 6 and out[:3].isdigit() and out[3] == "-" and out[4:].isdigit(), out


def test_json_schema_inline_and_from_a_file_with_speculation(cli, tmp_path):
    # The demo model: speculative output equals plain output token for token on quantized
    # weights (the tiny model is F32, where a verify batch may part at a near-tie).
    out = answer(cli("infer", "-p", "Describe Bob, 42 years old, as JSON.", "--json-schema", json.dumps(PERSON)))
    jsonschema.validate(json.loads(out), PERSON)
    (tmp_path / "person.json").write_text(json.dumps(PERSON))
    spec = cli("infer", "-p", "Describe Bob, 42 years old, as JSON.", "--json-schema", f"@{tmp_path / 'person.json'}",
               "--spec-type", "ngram-mod", "--draft-policy", "fixed", "--verbose")
    assert answer(spec) == out                    # speculation and forced drafts change no token
    assert "draft accept" in spec.stderr


@pytest.mark.parametrize("flags, words", [
    (["--grammar-string", "root ::= nothing"], "--grammar-string: invalid gbnf grammar"),
    (["--json-schema", '{"type": "objectx"}'], "--json-schema: invalid JSON schema"),
    (["--json-schema", "{oops"], "--json-schema: the JSON schema is not valid JSON"),
    (["--json-schema", "@/no/such/file.json"], "--json-schema /no/such/file.json"),
    (["--grammar-path", "/no/such.gbnf"], "--grammar-path /no/such.gbnf"),
])
def test_bad_grammars_are_usage_errors_naming_the_flag(cli, flags, words):
    proc = cli("infer", "-p", "hi", *flags)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_one_constraint_flag_at_a_time(cli):
    proc = cli("infer", "-p", "hi", "--grammar-string", 'root ::= "a"', "--json-schema", "{}")
    assert proc.returncode == 2 and "not allowed with argument" in proc.stderr, proc.stderr


def test_serve_grammar_dir_must_be_a_folder(cli, tmp_path):
    proc = cli("serve", "--host", "127.0.0.1:0", "--grammar-dir", tmp_path / "missing")
    assert proc.returncode == 2 and "--grammar-dir" in proc.stderr and "not a folder" in proc.stderr, proc.stderr
