"""The tiny Gemma-4 test-model generator (tests/support/tiny_gemma4.py): files, not inference.

End-to-end MTP tests that load these files into the library live elsewhere; these
check that the generator is deterministic and writes exactly the metadata and
tensors the library's recipe needs (so a failure there points at the library side).
"""

from pathlib import Path

import gguf
import numpy as np
import pytest

import tiny_gemma4 as tg

pytestmark = pytest.mark.fast   # needs no model: the fast tier

A = "gemma4-assistant"


def meta(path):
    """Metadata of a GGUF file as {key: python value}, without the file header."""
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def tensors(path):
    """{name: (ggml shape tuple, numpy data)} of a GGUF file."""
    reader = gguf.GGUFReader(path)
    return {t.name: (tuple(int(x) for x in t.shape), np.array(t.data)) for t in reader.tensors}


def diff_keys(a, b):
    ma, mb = meta(a), meta(b)
    return {k for k in ma.keys() | mb.keys() if ma.get(k) != mb.get(k)}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    target, assistant = tg.make_pair(d)
    aligned = tg.make_pair(d, aligned=True)
    return {"dir": d, "target": target, "assistant": assistant, "aligned": aligned,
            "variants": tg.make_mismatched(d)}


def test_deterministic_bytes(tmp_path):
    first = tg.make_pair(tmp_path / "a") + tg.make_pair(tmp_path / "a", aligned=True)
    second = tg.make_pair(tmp_path / "b") + tg.make_pair(tmp_path / "b", aligned=True)
    for p, q in zip(first, second):
        assert p.read_bytes() == q.read_bytes(), p.name
    # A different seed really changes the weights.
    other = tg.write_target(tmp_path / "seed5.gguf", seed=5)
    assert other.read_bytes() != first[0].read_bytes()


def test_small(tmp_path):
    target, assistant = tg.make_pair(tmp_path)
    assert target.stat().st_size < 600_000
    assert assistant.stat().st_size < 300_000


def test_target_metadata(models):
    m = meta(models["target"])
    assert m["general.architecture"] == "gemma4"
    expect = {
        "context_length": 512, "block_count": 2, "embedding_length": 64,
        "feed_forward_length": 128, "embedding_length_per_layer_input": 0,
        "attention.head_count": 2, "attention.head_count_kv": 1,
        "attention.key_length": 32, "attention.value_length": 32,
        "attention.key_length_swa": 32, "attention.value_length_swa": 32,
        "attention.sliding_window": 16, "attention.sliding_window_pattern": [True, False],
        "rope.dimension_count": 32, "rope.dimension_count_swa": 32,
        "rope.freq_base": 1e6, "rope.freq_base_swa": 1e4,
    }
    for key, value in expect.items():
        assert m[f"gemma4.{key}"] == pytest.approx(value), key
    assert m["tokenizer.ggml.model"] == "llama"
    assert len(m["tokenizer.ggml.tokens"]) == 256
    assert len(m["tokenizer.ggml.scores"]) == len(m["tokenizer.ggml.token_type"]) == 256
    assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"],
            m["tokenizer.ggml.unknown_token_id"]) == (tg.BOS_ID, tg.EOS_ID, tg.UNK_ID)
    # llama_chat_apply_template detects the gemma format by this substring.
    assert "<start_of_turn>" in m["tokenizer.chat_template"]


def test_target_tensors(models):
    t = tensors(models["target"])
    assert t["token_embd.weight"][0] == (64, 256)
    assert t["output.weight"][0] == (64, 256)  # untied head: greedy is not an echo
    assert t["rope_freqs.weight"][0] == (16,)
    for i in range(2):
        assert t[f"blk.{i}.attn_q.weight"][0] == (64, 64)
        assert t[f"blk.{i}.attn_k.weight"][0] == (64, 32)
        assert t[f"blk.{i}.attn_output.weight"][0] == (64, 64)
        assert t[f"blk.{i}.ffn_down.weight"][0] == (128, 64)
        assert t[f"blk.{i}.layer_output_scale.weight"][0] == (1,)
    np.testing.assert_array_equal(t["output_norm.weight"][1], 1.0)
    # Random but sane: no all-zero or huge matrices.
    q = t["blk.0.attn_q.weight"][1]
    assert 0.05 < float(np.std(q)) < 0.5


def test_assistant_metadata_and_tensors(models):
    m = meta(models["assistant"])
    assert m["general.architecture"] == A
    assert m[f"{A}.embedding_length"] == 32
    assert m[f"{A}.embedding_length_out"] == 64  # = the target's width
    assert m[f"{A}.nextn_predict_layers"] == m[f"{A}.block_count"] == 2
    assert m[f"{A}.attention.key_length"] == 32
    assert m[f"{A}.attention.sliding_window_pattern"] == [True, False]
    assert "tokenizer.chat_template" not in m
    t = tensors(models["assistant"])
    per_layer = ["attn_norm", "attn_q", "attn_output", "attn_q_norm", "post_attention_norm",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm",
                 "layer_output_scale"]
    # Any extra tensor (attn_k, output.weight, ...) makes the library refuse the file.
    assert set(t) == {"token_embd.weight", "output_norm.weight", "rope_freqs.weight",
                      "nextn.pre_projection.weight", "nextn.post_projection.weight"} | {
        f"blk.{i}.{n}.weight" for i in range(2) for n in per_layer}
    assert t["token_embd.weight"][0] == (32, 256)
    assert t["nextn.pre_projection.weight"][0] == (128, 32)
    assert t["nextn.post_projection.weight"][0] == (32, 64)
    assert t["blk.0.attn_q.weight"][0] == (32, 64)
    assert t["blk.0.attn_output.weight"][0] == (64, 32)


def test_vocab():
    tokens, scores, types = tg.spm_vocab()
    assert len(tokens) == len(set(tokens)) == len(scores) == len(types) == 256
    assert tokens[tg.BOS_ID] == "<s>" and tokens[tg.EOS_ID] == "</s>"
    assert tokens[tg.EOT_ID] == "<end_of_turn>"
    assert "<0x0A>" in tokens  # else the library uses <pad> as the newline token
    assert "\u2581" in tokens and " " not in tokens
    assert all(chr(c) in tokens for c in range(0x21, 0x7F))
    big, _, big_types = tg.spm_vocab(300)
    assert big[:256] == tokens and len(big) == 300
    assert set(big_types[256:]) == {int(gguf.TokenType.UNUSED)}
    with pytest.raises(ValueError):
        tg.spm_vocab(200)


def test_aligned_pair(models):
    target, assistant = models["aligned"]
    tt, at = tensors(target), tensors(assistant)
    embd = tt["token_embd.weight"][1].reshape(256, 64)
    assert not embd[:, 32:].any() and embd[:, :32].any()
    head = tt["output.weight"][1].reshape(256, 64)
    np.testing.assert_array_equal(at["token_embd.weight"][1].reshape(256, 32), head[:, :32])
    assert meta(assistant)[f"{A}.embedding_length_out"] == 64
    with pytest.raises(ValueError):
        tg.write_assistant(models["dir"] / "bad.gguf", align_with=models["target"])


# variant -> (which file differs from the good pair, metadata keys that differ)
_HEAD = {f"{A}.attention.{k}" for k in ("key_length", "value_length", "key_length_swa",
                                        "value_length_swa")}
EXPECTED = {
    "width": ("target", {"gemma4.embedding_length"}),
    "vocab": ("draft", {"tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                        "tokenizer.ggml.token_type"}),
    # value_length must follow key_length (the library requires them equal) and the
    # RoPE dimension follows the head size.
    "head_dim": ("draft", _HEAD | {f"{A}.rope.dimension_count",
                                   f"{A}.rope.dimension_count_swa"}),
    "swa_order": ("target", {"gemma4.attention.sliding_window_pattern"}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_variant_differs_in_intended_key(models, name):
    target, draft, reason = models["variants"][name]
    which, keys = EXPECTED[name]
    assert reason and isinstance(reason, str)
    if which == "target":
        assert draft == models["assistant"]
        assert diff_keys(models["target"], target) == keys
    else:
        assert target == models["target"]
        assert diff_keys(models["assistant"], draft) == keys


def test_variant_values(models):
    v = models["variants"]
    assert meta(v["width"][0])["gemma4.embedding_length"] == 48
    assert len(meta(v["vocab"][1])["tokenizer.ggml.tokens"]) == 320
    assert tensors(v["vocab"][1])["token_embd.weight"][0] == (32, 320)
    assert meta(v["head_dim"][1])[f"{A}.attention.key_length"] == 16
    assert meta(v["swa_order"][0])["gemma4.attention.sliding_window_pattern"] == [False, True]
    # Same weights as the good target: only the layer roles moved.
    good, swapped = tensors(models["target"]), tensors(v["swa_order"][0])
    assert all(np.array_equal(good[n][1], swapped[n][1]) for n in good)


@pytest.mark.parametrize("name,arch", [("arch_gemma4", "gemma4"), ("arch_llama", "llama")])
def test_wrong_architecture_drafts(models, name, arch):
    target, draft, reason = models["variants"][name]
    assert target == models["target"]
    assert meta(draft)["general.architecture"] == arch
    assert A in reason


def test_cli(tmp_path, capsys):
    assert tg.main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split("\t")[0] for line in lines]
    assert names == ["pair", "aligned", *tg.make_mismatched(tmp_path / "x")]
    for line in lines:
        for p in line.split("\t")[1:3]:
            assert Path(p).is_file()
