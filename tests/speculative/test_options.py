"""The options table owns every speculative setting: flags, request fields, schema,
cache key and API keywords are built from it (no model needed)."""
import argparse
import json
from pathlib import Path

import pytest

from geniex.errors import UsageError
from geniex.speculative import options
from geniex.speculative.options import FIELDS, SpecOptions

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[2]


def test_schema_file_matches_the_table():
    schema = json.loads((ROOT / "schemas" / "chat_completions.request.json").read_text())
    spec_props = {k: v for k, v in schema["properties"].items() if k.startswith("spec_")}
    assert spec_props == options.schema_properties(), "run: python tools/release/sync_schemas.py"
    assert schema["patternProperties"] == options.schema_unknown_pattern()


def test_every_field_has_a_flag_a_request_field_and_an_attribute():
    attrs = set(SpecOptions.__dataclass_fields__)
    for f in FIELDS:
        assert f.attr in attrs
        assert f.flag.startswith("--") and f.request.startswith("spec_")
        assert f.help


def test_cli_flags_come_from_the_table():
    p = argparse.ArgumentParser()
    options.add_flags(p.add_argument_group("spec"))
    args = p.parse_args(["--spec-type", "ngram-mod, Draft-Simple", "--draft-tokens", "5", "--ngram-max", "12"])
    spec = options.from_args(args)
    assert spec.types == ("ngram-mod", "draft-simple")
    assert spec.n_max == 5 and spec.ngram_max == 12 and spec.p_min == 0.0
    with pytest.raises(SystemExit):
        p.parse_args(["--ngram-max", str(options.MAX_DRAFT + 1)])
    with pytest.raises(SystemExit):
        p.parse_args(["--draft-tokens", "0"])


def test_request_fields_round_trip():
    spec = SpecOptions(types=("ngram-cache",), ngram_n=3, ngram_max=6, n_max=7)
    body = options.to_request(spec)
    assert set(body) == {f.request for f in FIELDS}
    back = options.from_request(body)
    assert back.key() == spec.key()
    assert options.to_request(SpecOptions()) == {}


@pytest.mark.parametrize("field,value,message", [
    ("spec_n_max", 0, "spec_n_max must be at least 1"),
    ("spec_ngram_max", 10_000_000, "spec_ngram_max must be at most"),
    ("spec_p_min", float("nan"), "spec_p_min must be a finite number"),
    ("spec_n_min", 2.5, "spec_n_min takes a whole number"),
])
def test_request_errors_name_the_request_field(field, value, message):
    with pytest.raises(UsageError) as e:
        options.from_request({"spec_type": "draft-simple", field: value})
    assert message in str(e.value) and "--" not in str(e.value)
    assert e.value.param == field


def test_integral_floats_become_integers():
    spec = options.from_request({"spec_type": "ngram-mod", "spec_ngram_n": 4.0})
    assert spec.ngram_n == 4 and isinstance(spec.ngram_n, int)


def test_cache_key_holds_only_what_the_methods_read():
    a = SpecOptions(types=("ngram-mod",), n_max=3)
    b = SpecOptions(types=("ngram-mod",), n_max=9, p_min=0.5)
    assert a.key() == b.key()                     # n-gram methods ignore draft-model settings
    assert a.key() != SpecOptions(types=("ngram-mod",), ngram_max=5).key()
    c = SpecOptions(types=("draft-simple",), draft_model="x", ngram_max=5)
    assert c.key() == SpecOptions(types=("draft-simple",), draft_model="x").key()
    assert c.key() != SpecOptions(types=("draft-simple",), draft_model="x", n_max=4).key()
    assert SpecOptions().key() == ()


def test_ngram_defaults_and_longest_draft():
    spec = SpecOptions(types=("ngram-mod", "draft-mtp"), n_max=3)
    assert spec.ngram_settings("ngram-mod") == options.NGRAM_DEFAULTS["ngram-mod"]
    assert spec.longest_draft() == max(3, options.NGRAM_DEFAULTS["ngram-mod"][2])
    assert SpecOptions(types=("ngram-mod",), ngram_max=20).longest_draft() == 20


def test_api_keywords_are_the_flag_names():
    spec = options.from_kwargs({"spec_type": "ngram-simple", "ngram_n": 2})
    assert spec.types == ("ngram-simple",) and spec.ngram_n == 2
    with pytest.raises(UsageError, match="unknown speculative setting"):
        options.from_kwargs({"draft_tokenz": 3})
