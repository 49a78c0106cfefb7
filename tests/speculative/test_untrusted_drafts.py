"""Every file handed to llama.cpp goes through geniex's GGUF checks first: a draft model,
an MTP assistant and a target with NextN layers that llama.cpp would abort on are
refused (a draft: the speculative setup falls back to plain decoding) with one line."""
import struct

import pytest

from geniex.errors import ModelLoadError
from geniex.speculative.options import FALLBACK

import gguf_mutants

PROMPT = "Hello"


def with_value(src, dst, key, value):
    """A copy of GGUF ``src`` at ``dst`` with the u32 ``key`` set to ``value``."""
    parsed = gguf_mutants.parse(src)
    kvs = [kv if kv.key != key else gguf_mutants.KV(key, 4, struct.pack("<I", value), value) for kv in parsed.kvs]
    assert any(kv.key == key for kv in parsed.kvs), key
    gguf_mutants.Mutant(0, "test", key, kvs=kvs).write(parsed, dst)
    return dst


def test_a_broken_mtp_assistant_falls_back_before_the_library_sees_it(tiny, cli, tmp_path):
    target, assistant = tiny["aligned"]
    broken = with_value(assistant, tmp_path / "assistant-0-layers.gguf", "gemma4-assistant.block_count", 0)
    proc = cli("infer", target, "-p", PROMPT, "--spec-type", "draft-mtp", "--draft-model", broken,
               "--max-tokens", "8", env={"GGML_NO_BACKTRACE": "1"})
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if FALLBACK in ln]
    assert str(broken) in line and "block_count is 0" in line


def test_a_broken_plain_draft_falls_back(tiny, cli, tmp_path):
    target, _ = tiny["aligned"]
    broken = with_value(target, tmp_path / "draft-bad-heads.gguf", "gemma4.attention.head_count_kv", 3)
    proc = cli("infer", target, "-p", PROMPT, "--spec-type", "draft-simple", "--draft-model", broken,
               "--max-tokens", "8", "--draft-policy", "fixed")
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if FALLBACK in ln]
    assert str(broken) in line and "KV heads must divide the heads" in line


def test_a_target_claiming_more_nextn_layers_than_it_has_is_refused(tmp_path):
    import tiny_nextn
    from geniex.engine.session import LoadOptions, Session
    from geniex.speculative.options import SpecOptions
    good = tiny_nextn.write_target(tmp_path / "nextn.gguf")
    bad = with_value(good, tmp_path / "nextn-9.gguf", "qwen35.nextn_predict_layers", 9)
    with pytest.raises(ModelLoadError, match="nextn_predict_layers is 9, more than the 3 layers"):
        Session(bad, LoadOptions(nctx=256, spec=SpecOptions(types=("draft-mtp",))))
