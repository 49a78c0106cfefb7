"""geniex.llama.gguf_file refuses, with one line naming the file and the problem, each kind
of GGUF that llama.cpp b11549 would abort on (or that would cost a hang or gigabytes to
read): one minimal bad file per rule, made with the gguf package or by patching bytes."""
import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from geniex.errors import ModelLoadError
from geniex.llama import gguf_file
from geniex.llama.gguf_file import GGML_TYPES, read_header

import gguf_mutants

TOKENS = ["<s>", "</s>", "a", "b", "c", "d", "e", "f"]
ARCH = "llama"


def base_kvs():
    """Metadata of a minimal llama model: {key: (value, type, element type)}."""
    k = f"{ARCH}."
    return {
        k + "block_count": (1, V.UINT32, None), k + "context_length": (64, V.UINT32, None),
        k + "embedding_length": (64, V.UINT32, None), k + "feed_forward_length": (128, V.UINT32, None),
        k + "attention.head_count": (4, V.UINT32, None), k + "attention.head_count_kv": (2, V.UINT32, None),
        k + "rope.dimension_count": (16, V.UINT32, None),
        k + "attention.layer_norm_rms_epsilon": (1e-5, V.FLOAT32, None),
        "tokenizer.ggml.model": ("gpt2", V.STRING, None),
        "tokenizer.ggml.tokens": (TOKENS, V.ARRAY, V.STRING),
        "tokenizer.ggml.bos_token_id": (0, V.UINT32, None), "tokenizer.ggml.eos_token_id": (1, V.UINT32, None),
    }


def base_tensors():
    """{name: (numpy data, raw ggml type or None for its own dtype)}."""
    rng = np.random.default_rng(0)
    return {
        "token_embd.weight": (rng.standard_normal((8, 64)).astype(np.float32), None),
        "output_norm.weight": (np.ones(64, np.float32), None),
        "blk.0.attn_norm.weight": (np.ones(64, np.float32), None),
        "blk.0.attn_q.weight": (rng.standard_normal((64, 64)).astype(np.float16), None),
        "blk.0.ffn_up.weight": (np.zeros((128, 2 * 34), np.uint8), Q.Q8_0),
    }


def write(path, kvs=None, drop=(), tensors=None, arch=ARCH, alignment=None):
    """A GGUF at ``path``: the minimal model with ``kvs`` set (value, type[, element type])
    and ``drop`` removed; ``tensors`` replaces entries of the tensor table."""
    meta = base_kvs()
    for key, spec in (kvs or {}).items():
        meta[key] = spec if len(spec) == 3 else (*spec, None)
    writer = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        writer.add_uint32("general.alignment", alignment)
    for key, (value, vtype, sub) in meta.items():
        if key not in drop:
            writer.add_key_value(key, value, vtype, sub_type=sub)
    table = base_tensors()
    table.update(tensors or {})
    for name, (data, raw) in table.items():
        writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def patched(path, field_label, value):
    """``path`` with the header field labelled ``field_label`` (gguf_mutants' map) set to ``value``."""
    source = gguf_mutants.parse(path)
    field = next(f for f in source.fields if f.label == field_label)
    data = bytearray(path.read_bytes())
    size = struct.calcsize(field.fmt)
    data[field.offset:field.offset + size] = (value % (1 << (8 * size))).to_bytes(size, "little")
    out = path.with_name(f"patched-{path.name}")
    out.write_bytes(bytes(data))
    return out


def refused(path, *words):
    with pytest.raises(ModelLoadError) as caught:
        read_header(path)
    message = str(caught.value)
    assert str(path) in message and "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


@pytest.fixture
def good(tmp_path):
    return write(tmp_path / "good.gguf")


# -- the good file, and the type table --------------------------------------------------

@pytest.mark.fast
def test_the_minimal_model_passes(good):
    header = read_header(good)
    assert header.architecture == ARCH and len(header.tensors) == 5
    assert int(header.metadata["tokenizer.ggml.tokens"]) == len(TOKENS)


def test_the_type_table_is_the_librarys():
    from geniex.llama import library
    lib = library.load()
    for type_id in range(64):
        block, size = lib.ggml_blck_size(type_id), lib.ggml_type_size(type_id)
        if type_id in GGML_TYPES:
            assert GGML_TYPES[type_id][1:] == (block, size), type_id
        else:
            assert block == 0 or type_id >= 43, type_id   # removed ids and the end of the enum


# -- the container (ggml/src/gguf.cpp) ---------------------------------------------------

@pytest.mark.fast
def test_bad_magic(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGUX" + b"\0" * 100)
    refused(tmp_path / "x.gguf", "not a GGUF model file")


@pytest.mark.fast
@pytest.mark.parametrize("version", [0, 1, 4, 0x03000000])
def test_unsupported_version(good, version):
    refused(patched(good, "the version", version), f"GGUF version {version}")


@pytest.mark.fast
@pytest.mark.parametrize("label, value, words", [
    ("tensor count", 2**63 - 1, ["claims 9,223,372,036,854,775,807 tensors"]),
    ("tensor count", -1, ["claims -1 tensors"]),
    ("metadata count", 2**40, ["metadata entries, more than the file could hold"]),
])
def test_counts_are_bounded_by_the_file(good, label, value, words):
    refused(patched(good, label, value), *words)


@pytest.mark.fast
def test_a_string_longer_than_the_rest_of_the_file(good):
    refused(patched(good, "length of general.architecture", 2**63 - 1), "claims 9,223,372,036,854,775,807 bytes")


@pytest.mark.fast
def test_a_string_over_the_readers_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_file, "MAX_STRING", 100)
    path = write(tmp_path / "s.gguf", {"general.name": ("x" * 200, V.STRING)})
    refused(path, "is 200 bytes long")


@pytest.mark.fast
def test_an_array_longer_than_the_rest_of_the_file(good):
    # a token_type of 2^63-1 once took gguf-py 200 s and 5.2 GB
    refused(patched(good, "length of tokenizer.ggml.tokens", 2**63 - 1), "tokenizer.ggml.tokens claims", "elements")


@pytest.mark.fast
def test_an_empty_key(good):
    refused(patched(good, "a key's length", 0), "metadata key 0 is empty")


def _renamed_key(path, old, new):
    """``path`` with the metadata key ``old`` renamed ``new`` (same length)."""
    assert len(old) == len(new)
    source = gguf_mutants.parse(path)
    data = bytearray(path.read_bytes())
    for field in (f for f in source.fields if f.kind == "kv-key-length"):
        if data[field.offset + 8:field.offset + 8 + len(old)] == old.encode():
            data[field.offset + 8:field.offset + 8 + len(old)] = new.encode()
    out = path.with_name("renamed-key.gguf")
    out.write_bytes(bytes(data))
    return out


def _with_value(path, key, vtype, raw):
    """``path`` rewritten with metadata ``key`` set to the encoded value ``raw`` (any
    bytes, even ones the gguf package would refuse to write)."""
    source = gguf_mutants.parse(path)
    kvs = [kv if kv.key != key else gguf_mutants.KV(key, vtype, raw) for kv in source.kvs]
    out = path.with_name("rewritten.gguf")
    gguf_mutants.Mutant(0, "test", key, kvs=kvs).write(source, out)
    return out


@pytest.mark.fast
def test_a_duplicate_key(good):
    dup = _renamed_key(good, "tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id")
    refused(dup, "metadata key tokenizer.ggml.bos_token_id appears twice")


@pytest.mark.fast
@pytest.mark.parametrize("value, words", [(13, "value type 13"), (2**31, "value type 2147483648")])
def test_an_unknown_value_type(good, value, words):
    refused(patched(good, f"type of {ARCH}.block_count", value), words)


@pytest.mark.fast
def test_a_nested_array(good):
    refused(patched(good, "element type of tokenizer.ggml.tokens", 9), "array of arrays")


@pytest.mark.fast
def test_an_array_of_an_unknown_type(good):
    refused(patched(good, "element type of tokenizer.ggml.tokens", 77), "array of value type 77")


@pytest.mark.fast
@pytest.mark.parametrize("vtype, value, words", [
    (V.INT32, 32, ["general.alignment is a i32, not a u32"]),
    (V.UINT32, 0, ["general.alignment 0 is not a power of two"]),
    (V.UINT32, 48, ["general.alignment 48 is not a power of two"]),
])
def test_general_alignment_must_be_a_u32_power_of_two(tmp_path, vtype, value, words):
    refused(write(tmp_path / "a.gguf", {"general.alignment": (value, vtype)}), *words)


@pytest.mark.fast
def test_tensors_off_ggmls_32_byte_boundary(tmp_path):
    # alignment 1 is a valid power of two, but ggml's CPU buffers need 32-byte tensors
    # (llama.cpp aborted on exactly this file).
    refused(write(tmp_path / "a.gguf", alignment=1), "not on a 32-byte boundary")


@pytest.mark.fast
def test_an_empty_tensor_name(good):
    refused(patched(good, "a tensor name's length", 0), "tensor 0 has an empty name")


@pytest.mark.fast
def test_a_tensor_name_too_long_for_ggml(tmp_path):
    refused(write(tmp_path / "n.gguf", tensors={"x" * 64: (np.ones(64, np.float32), None)}), "is 64 bytes")


@pytest.mark.fast
def test_a_duplicate_tensor_name(good):
    refused(_renamed(good, "blk.0.ffn_up.weight", "blk.0.attn_q.weight"), "'blk.0.attn_q.weight' appears twice")


def _renamed(path, old, new):
    """The tensor table entry ``old`` renamed to ``new`` (same length required)."""
    assert len(old) == len(new)
    source = gguf_mutants.parse(path)
    entry = next(t for t in source.tensors if t.name == old)
    data = bytearray(path.read_bytes())
    data[entry.info_offset + 8:entry.info_offset + 8 + len(old)] = new.encode()
    out = path.with_name("renamed.gguf")
    out.write_bytes(bytes(data))
    return out


@pytest.mark.fast
def test_too_many_dimensions(good):
    refused(patched(good, "dimension count of output_norm.weight", 5), "has 5 dimensions")


@pytest.mark.fast
def test_a_negative_dimension(good):
    refused(patched(good, "a dimension of output_norm.weight", -1), "negative dimension")


@pytest.mark.fast
def test_an_element_count_ggml_cannot_hold(good):
    source = gguf_mutants.parse(good)
    dims = [f for f in source.fields if f.label == "a dimension of blk.0.attn_q.weight"]
    data = bytearray(good.read_bytes())
    for f in dims:
        data[f.offset:f.offset + 8] = struct.pack("<q", 2**40)
    (good.parent / "big.gguf").write_bytes(bytes(data))
    refused(good.parent / "big.gguf", "more than ggml can count")


@pytest.mark.fast
@pytest.mark.parametrize("type_id", [4, 31, 36, 43, 2**31 - 1])
def test_a_tensor_type_the_library_does_not_know(good, type_id):
    refused(patched(good, "type of output_norm.weight", type_id), f"has type {type_id}", "does not know")


@pytest.mark.fast
def test_a_row_that_is_not_a_whole_number_of_blocks(tmp_path):
    bad = np.zeros((2, 34), np.uint8)                  # Q8_0 rows of 32: fine
    path = write(tmp_path / "b.gguf", tensors={"blk.0.ffn_up.weight": (bad, Q.Q8_0)})
    refused(patched(path, "a dimension of blk.0.ffn_up.weight", 48), "not a multiple of its block of 32")


@pytest.mark.fast
def test_data_offsets_out_of_table_order(good):
    source = gguf_mutants.parse(good)
    second = [f for f in source.fields if f.kind == "tensor-offset"][1]
    old = struct.unpack_from("<Q", good.read_bytes(), second.offset)[0]
    refused(patched(good, second.label, old + 32), "the tensors before it end at")


@pytest.mark.fast
def test_tensor_data_past_the_end_of_the_file(good):
    (good.parent / "cut.gguf").write_bytes(good.read_bytes()[:-64])
    refused(good.parent / "cut.gguf", "truncated", "its tensors need")


# -- the model (llama-model-loader, load_hparams, llama-vocab) ---------------------------

@pytest.mark.fast
@pytest.mark.parametrize("kvs, drop, words", [
    ({"general.architecture": (7, V.UINT32)}, [], ["general.architecture is not text"]),
    ({}, [f"{ARCH}.block_count"], ["llama.block_count) is missing"]),
    ({f"{ARCH}.block_count": (0, V.UINT32)}, [], ["block_count is 0"]),
    ({f"{ARCH}.block_count": (513, V.UINT32)}, [], ["block_count is 513"]),
    ({f"{ARCH}.block_count": ("one", V.STRING)}, [], ["block_count is text, not a whole number"]),
    ({}, [f"{ARCH}.context_length"], ["context_length) is missing"]),
    ({f"{ARCH}.context_length": (0, V.UINT32)}, [], ["context_length is 0"]),
    ({f"{ARCH}.embedding_length": (0, V.UINT32)}, [], ["embedding_length is 0"]),
    ({f"{ARCH}.nextn_predict_layers": (2, V.UINT32)}, [], ["nextn_predict_layers is 2"]),
    ({f"{ARCH}.attention.head_count_kv": (3, V.UINT32)}, [], ["4 attention heads and 3 KV heads"]),
    ({f"{ARCH}.attention.head_count_kv": (0, V.UINT32)}, [], ["4 attention heads and 0 KV heads"]),
    ({f"{ARCH}.attention.head_count": (6, V.UINT32), f"{ARCH}.attention.head_count_kv": (6, V.UINT32)}, [],
     ["embedding_length 64 is not a multiple of the 6 attention heads"]),
    ({f"{ARCH}.attention.key_length": (0, V.UINT32)}, [], ["attention.key_length is 0"]),
    ({f"{ARCH}.rope.dimension_count": (17, V.UINT32)}, [], ["rope.dimension_count 17 is wider"]),
    ({f"{ARCH}.attention.head_count": ([4, 4], V.ARRAY, V.UINT32)}, [], ["has 2 entries for 1 layers"]),
    ({f"{ARCH}.attention.head_count": ([-4], V.ARRAY, V.INT32)}, [], ["other than whole numbers >= 0"]),
    ({f"{ARCH}.expert_count": (2000, V.UINT32)}, [], ["expert_count is 2000"]),
    ({f"{ARCH}.expert_count": (8, V.UINT32), f"{ARCH}.expert_used_count": (9, V.UINT32)}, [],
     ["expert_used_count 9"]),
    ({f"{ARCH}.expert_count": (8, V.UINT32)}, [], ["expert_used_count 0"]),
    ({f"{ARCH}.expert_used_count": (2, V.UINT32)}, [], ["on a model without experts"]),
    ({f"{ARCH}.expert_count": (8, V.UINT32), f"{ARCH}.expert_used_count": (2, V.UINT32),
      f"{ARCH}.expert_group_count": (3, V.UINT32), f"{ARCH}.expert_group_used_count": (1, V.UINT32)}, [],
     ["does not divide the 8 experts"]),
    ({f"{ARCH}.rope.scaling.type": ("warp", V.STRING)}, [], ["rope.scaling.type 'warp'"]),
    ({f"{ARCH}.classifier.activation": ("relu6", V.STRING)}, [], ["classifier.activation 'relu6'"]),
    ({"split.no": (1, V.UINT16)}, [], ["shard 2 of a split model"]),
])
def test_model_hyperparameters_llama_cpp_asserts_on(tmp_path, kvs, drop, words):
    refused(write(tmp_path / "m.gguf", kvs, drop), "not a usable model", *words)


@pytest.mark.fast
@pytest.mark.parametrize("kvs, words", [
    ({"tokenizer.ggml.tokens": (["a", "b", "a"], V.ARRAY, V.STRING)}, ["token 2", "repeats an earlier token's text 'a'"]),
    ({"tokenizer.ggml.tokens": (["", "[EMPTY_0]"], V.ARRAY, V.STRING)}, ["token 1", "[EMPTY_0]"]),
    ({"tokenizer.ggml.tokens": ("abc", V.STRING)}, ["not an array of text"]),
    ({"tokenizer.ggml.bos_token_id": (8, V.UINT32)}, ["bos_token_id is 8, but the vocabulary has 8 tokens"]),
    ({"tokenizer.ggml.unknown_token_id": (2**32 - 1, V.UINT32)}, ["unknown_token_id is 4294967295"]),
    ({"tokenizer.ggml.eos_token_id": ("1", V.STRING)}, ["eos_token_id is text"]),
])
def test_vocabularies_llama_cpp_asserts_on(tmp_path, kvs, words):
    refused(write(tmp_path / "v.gguf", kvs), *words)


@pytest.mark.fast
@pytest.mark.parametrize("window", [16, 45, 1 << 20])
def test_string_arrays_read_the_same_through_any_window(tmp_path, monkeypatch, window):
    """A vocabulary's strings are sliced from the reader's window without a call each,
    and go the long way at the window's edge (_Cursor.strings): through windows that cut
    strings anywhere, the header reads the same, a repeated token is found wherever it
    falls, and a long array (the merges) is skipped to its length."""
    tokens = TOKENS + [f"tok{i}" for i in range(300)]
    kvs = {"tokenizer.ggml.tokens": (tokens, V.ARRAY, V.STRING),
           "tokenizer.ggml.merges": ([f"tok{i} tok{i + 1}" for i in range(299)], V.ARRAY, V.STRING),
           "general.tags": (["a", "bc", "def"], V.ARRAY, V.STRING)}
    path = write(tmp_path / "long.gguf", kvs)
    whole = read_header(path, check_model=False).metadata
    monkeypatch.setattr(gguf_file._Cursor, "WINDOW", window)
    meta = read_header(path, check_model=False).metadata
    assert meta == whole
    assert (meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.merges"]) == (308, 299)
    assert meta["general.tags"] == ["a", "bc", "def"] and meta["general.architecture"] == ARCH
    tokens[250] = "tok7"
    refused(write(tmp_path / "dup.gguf", {"tokenizer.ggml.tokens": (tokens, V.ARRAY, V.STRING)}),
            "token 250", "repeats an earlier token's text 'tok7'")


@pytest.mark.fast
def test_an_out_of_range_padding_id_is_left_to_llama_cpp(tmp_path):
    # llama.cpp disables such an id with a warning (llama-vocab.cpp): the file loads.
    path = write(tmp_path / "p.gguf", {"tokenizer.ggml.padding_token_id": (2**32 - 1, V.UINT32)})
    assert read_header(path).metadata["tokenizer.ggml.padding_token_id"] == 2**32 - 1


@pytest.mark.fast
def test_a_model_without_an_architecture(good):
    refused(_renamed_key(good, "general.architecture", "general.architectura"), "general.architecture is missing")


@pytest.mark.fast
def test_an_empty_vocabulary(good):
    empty = _with_value(good, "tokenizer.ggml.tokens", gguf_mutants.ARRAY, struct.pack("<IQ", gguf_mutants.STRING, 0))
    refused(empty, "tokenizer.ggml.tokens is empty")


@pytest.mark.fast
@pytest.mark.parametrize("name, data, raw, words", [
    ("output_norm.weight", np.ones(64, np.float16), None, ["(a norm, bias or scale) is F16"]),
    ("blk.0.attn_norm.weight", np.zeros((2, 34), np.uint8), Q.Q8_0, ["is Q8_0; llama.cpp needs F32"]),
    ("blk.0.ffn_norm.weight", np.ones((2, 64), np.float16), None, ["ffn_norm.weight' (a norm"]),
    ("blk.0.ffn_up.weight", np.zeros((128, 292), np.uint8), Q.Q8_K, ["is Q8_K, a type no model weight"]),
    ("blk.0.ffn_up.weight", np.zeros((128, 64), np.int32), None, ["is I32, a type no model weight"]),
])
def test_tensor_types_llama_cpps_kernels_abort_on(tmp_path, name, data, raw, words):
    refused(write(tmp_path / "t.gguf", tensors={name: (data, raw)}), *words)


@pytest.mark.fast
def test_every_shard_of_a_split_model_is_read(tmp_path):
    first = write(tmp_path / "m-00001-of-00002.gguf", {"split.count": (2, V.UINT16), "split.no": (0, V.UINT16)})
    refused(first, "its shard m-00002-of-00002.gguf is missing")
    second = write(tmp_path / "m-00002-of-00002.gguf", {"split.count": (2, V.UINT16), "split.no": (1, V.UINT16)},
                   tensors={"blk.0.ffn_norm.weight": (np.ones(64, np.float16), None)})
    with pytest.raises(ModelLoadError, match=r"m-00002-of-00002\.gguf is not a usable model shard: .* is F16"):
        read_header(first)
    write(second, {"split.count": (2, V.UINT16), "split.no": (1, V.UINT16)})
    assert read_header(first).architecture == ARCH
    named_wrong = tmp_path / "m.gguf"
    first.rename(named_wrong)
    refused(named_wrong, "first of 2 shards but is not named")


@pytest.mark.fast
@pytest.mark.parametrize("kvs, drop, words", [
    ({"split.no": (1, V.UINT32)}, [], "its split.no is a u32, not the u16 llama-gguf-split writes"),
    ({"split.no": (2, V.UINT16)}, [], "its split.no makes it shard 3 of the split, not shard 2 as its name says"),
    ({"split.count": (3, V.UINT16)}, [], "its split.count is 3, but the first shard's is 2: it belongs to another"),
    ({}, ["split.no"], "split.no is missing"),
    ({}, ["split.count"], "split.count is missing"),
])
def test_the_other_shards_are_that_shard_of_that_split(tmp_path, kvs, drop, words):
    # llama.cpp refuses a shard whose split.no is missing or wrong, and aborts on one that
    # is not a u16; split.count (as llama-gguf-split writes it) ties the shard to its split.
    first = write(tmp_path / "m-00001-of-00002.gguf", {"split.count": (2, V.UINT16), "split.no": (0, V.UINT16)})
    second = write(tmp_path / "m-00002-of-00002.gguf",
                   {"split.count": (2, V.UINT16), "split.no": (1, V.UINT16), **kvs}, drop)
    with pytest.raises(ModelLoadError) as caught:
        read_header(first)
    assert str(caught.value).startswith(f"{second} is not a usable model shard: ") and words in str(caught.value)


@pytest.mark.fast
def test_the_container_alone_can_be_read_without_the_model_checks(tmp_path):
    path = write(tmp_path / "c.gguf", {f"{ARCH}.block_count": (0, V.UINT32)})
    assert read_header(path, check_model=False).arch_key("block_count") == 0


# -- values llama.cpp takes at load and aborts (or hangs) on later (issue 36) -------------

F32_TYPE = 6                          # GGUF's f32 value type (gguf_mutants.SCALARS)
NAN, INF = float("nan"), float("inf")
SPM_BYTES = [f"<0x{b:02X}>" for b in range(256)]


def _f32(value):
    return (value, V.FLOAT32)


def _u32(value):
    return (value, V.UINT32)


def _spm(tokens):
    return {"tokenizer.ggml.model": ("llama", V.STRING), "tokenizer.ggml.tokens": (tokens, V.ARRAY, V.STRING)}


# key changes -> words of the refusal (None: the file passes). The minimal model's head
# is 16 wide (embedding 64, 4 heads). One row per rule of gguf_file, and its edge.
RULES = [
    ({f"{ARCH}.attention.layer_norm_rms_epsilon": _f32(NAN)}, ["layer_norm_rms_epsilon is nan, not a finite number"]),
    ({f"{ARCH}.attention.layer_norm_rms_epsilon": _f32(-1.0)}, ["layer_norm_rms_epsilon is -1.0; it must be 0 or more"]),
    ({f"{ARCH}.attention.layer_norm_rms_epsilon": _f32(INF)}, ["layer_norm_rms_epsilon is inf, not a finite"]),
    ({f"{ARCH}.attention.layer_norm_rms_epsilon": _f32(0.0)}, None),
    ({f"{ARCH}.attention.layer_norm_epsilon": _f32(-0.5)}, ["layer_norm_epsilon is -0.5; it must be 0 or more"]),
    ({f"{ARCH}.attention.group_norm_epsilon": _f32(-INF)}, ["group_norm_epsilon is -inf, not a finite"]),
    ({f"{ARCH}.hyper_connection.epsilon": (-1.0, V.FLOAT64)}, ["hyper_connection.epsilon is -1.0; it must be 0"]),
    ({f"{ARCH}.rope.freq_base": _f32(NAN)}, ["rope.freq_base is nan, not a finite number"]),
    ({f"{ARCH}.rope.freq_base": _f32(-1.0)}, None),          # nonsense, but nothing aborts on it
    ({f"{ARCH}.rope.scaling.yarn_ext_factor": _f32(-1.0)}, ["yarn_ext_factor is -1.0; it must be 0 or more"]),
    ({f"{ARCH}.swiglu_clamp_exp": ([7.0, NAN], V.ARRAY, V.FLOAT32)}, ["swiglu_clamp_exp is nan, not a finite"]),
    ({f"{ARCH}.rope.dimension_count": _u32(0)}, ["rope.dimension_count is 0; llama.cpp rotates an even number"]),
    ({f"{ARCH}.rope.dimension_count": _u32(15)}, ["rope.dimension_count is 15;"]),
    ({f"{ARCH}.rope.dimension_count": _u32(18)}, ["rope.dimension_count 18 is wider than an attention head (16)"]),
    ({f"{ARCH}.rope.dimension_count": _u32(2)}, None),
    ({f"{ARCH}.rope.dimension_count_swa": _u32(1)}, ["rope.dimension_count_swa is 1;"]),
    ({f"{ARCH}.rope.dimension_count_swa": _u32(20)}, ["rope.dimension_count_swa 20 is wider than an attention head (16)"]),
    ({f"{ARCH}.rope.dimension_count_swa": _u32(20), f"{ARCH}.attention.key_length_swa": _u32(8)},
     ["rope.dimension_count_swa 20 is wider than an attention head (8)"]),
    ({f"{ARCH}.rope.dimension_count_swa": _u32(32), f"{ARCH}.attention.key_length_swa": _u32(32)}, None),
    ({f"{ARCH}.full_attention_interval": _u32(0)}, ["full_attention_interval is 0; it must be at least 1"]),
    ({f"{ARCH}.interleave_moe_layer_step": _u32(0)}, ["interleave_moe_layer_step is 0; it must be at least 1"]),
    ({f"{ARCH}.hrm.h_cycles": _u32(0)}, ["hrm.h_cycles is 0"]),
    ({f"{ARCH}.full_attention_interval": _u32(4)}, None),
    ({f"{ARCH}.rope.dimension_sections": ([0, 0, 0, 8], V.ARRAY, V.INT32)}, ["is [0, 0, 0, 8]; llama.cpp needs one"]),
    ({f"{ARCH}.rope.dimension_sections": ([8, 8, 1, 0], V.ARRAY, V.INT32)}, ["adds up to 17, more than an attention"]),
    ({f"{ARCH}.rope.dimension_sections": ([4, 6, 6, 0], V.ARRAY, V.INT32)}, None),
    (_spm(TOKENS), ["model is 'llama' (SentencePiece), but the vocabulary has no token for byte 0x00",
                    "and 235 more"]),
    (_spm(TOKENS + SPM_BYTES), None),
    (_spm(TOKENS + [t for t in SPM_BYTES if t != "<0xE2>"]), ["no token for byte 0xE2 (neither <0xE2> nor"]),
    # the space is written as U+2581 first, and bytes UTF-8 never holds are never asked for
    (_spm(TOKENS + [t for t in SPM_BYTES if t not in ("<0x20>", "<0xC0>", "<0xFF>")]), None),
    (_spm(TOKENS + [t for t in SPM_BYTES if t != "<0x41>"] + ["A"]), None),    # the byte's own text will do
    ({"tokenizer.ggml.tokens": (TOKENS, V.ARRAY, V.STRING)}, None),          # gpt2 (BPE) spells around gaps
    ({"tokenizer.ggml.model": ("t5", V.STRING), "tokenizer.ggml.add_bos_token": (True, V.BOOL)}, None),
    ({"tokenizer.ggml.model": ("gpt2", V.STRING), "tokenizer.ggml.add_bos_token": (True, V.BOOL)}, None),
]


@pytest.mark.fast
@pytest.mark.parametrize("kvs, words", RULES, ids=lambda x: None)
def test_values_llama_cpp_aborts_or_hangs_on_later(tmp_path, kvs, words):
    path = write(tmp_path / "r.gguf", kvs)
    if words is None:
        read_header(path)
    else:
        refused(path, "not a usable model", *words)


@pytest.mark.fast
@pytest.mark.parametrize("model, refuse", [("t5", True), ("gpt2", False), ("llama", False)])
def test_a_bos_the_tokenizer_cannot_have(tmp_path, model, refuse):
    # BOS asked for, and none named: SPM and BPE default to a token, UGM ('t5') to none
    kvs = {"tokenizer.ggml.model": (model, V.STRING), "tokenizer.ggml.add_bos_token": (True, V.BOOL),
           "tokenizer.ggml.tokens": (TOKENS + SPM_BYTES, V.ARRAY, V.STRING)}
    path = write(tmp_path / "b.gguf", kvs, drop=["tokenizer.ggml.bos_token_id"])
    if refuse:
        refused(path, "add_bos_token is true, but a 't5' vocabulary has no BOS token")
    else:
        read_header(path)


@pytest.mark.fast
@pytest.mark.parametrize("raw", [struct.pack("<f", NAN), struct.pack("<f", -1.0)], ids=["nan", "-1"])
def test_a_bad_epsilon_written_over_the_file_is_refused(good, raw):
    # the gguf package writes what it is given; the rewrite puts the raw bytes of a
    # damaged copy in place, as the issue's files had them
    bad = _with_value(good, f"{ARCH}.attention.layer_norm_rms_epsilon", F32_TYPE, raw)
    refused(bad, f"{ARCH}.attention.layer_norm_rms_epsilon is ")


@pytest.mark.fast
@pytest.mark.parametrize("model, words", [("none", "'none', no tokenizer"), ("no_vocab", "'no_vocab', no tokenizer"),
                                          ("gpt2", None)])
def test_a_model_without_a_tokenizer_cannot_read_prompts(tmp_path, model, words):
    # Such a file is a draft's (a gemma4-assistant reads the target's tokens), so it
    # passes read_header; it is refused as the model a session reads prompts with.
    header = read_header(write(tmp_path / "n.gguf", {"tokenizer.ggml.model": (model, V.STRING)}))
    if words is None:
        gguf_file.check_tokenizer(header)
        return
    with pytest.raises(ModelLoadError, match=words):
        gguf_file.check_tokenizer(header)


@pytest.mark.fast
def test_a_delta_net_inner_size_must_match_its_tensors(tmp_path):
    import tiny_nextn
    path = tiny_nextn.write_target(tmp_path / "q.gguf", nextn=False)
    read_header(path)
    bad = _with_value(path, "qwen35.ssm.inner_size", V.UINT32, struct.pack("<I", 64))
    refused(bad, "qwen35.ssm.inner_size is 64, but tensor 'blk.0.ssm_out.weight' is 32 wide")


def _demo_with(tmp_path, key, vtype, raw):
    source = gguf_mutants.parse(gguf_mutants.demo_path())
    kvs = [kv if kv.key != key else gguf_mutants.KV(key, vtype, raw) for kv in source.kvs]
    out = tmp_path / "demo-mutant.gguf"
    gguf_mutants.Mutant(0, "issue-36", key, kvs=kvs).write(source, out)
    return out


@pytest.mark.parametrize("key, vtype, raw, words", [
    ("tokenizer.ggml.model", gguf_mutants.STRING, gguf_mutants.encode_string("none"),
     "tokenizer.ggml.model is 'none', no tokenizer"),
    ("llama.attention.layer_norm_rms_epsilon", F32_TYPE, struct.pack("<f", NAN),
     "llama.attention.layer_norm_rms_epsilon is nan, not a finite number"),
    ("llama.attention.layer_norm_rms_epsilon", F32_TYPE, struct.pack("<f", -1.0),
     "llama.attention.layer_norm_rms_epsilon is -1.0; it must be 0 or more"),
], ids=["tokenizer-none", "epsilon-nan", "epsilon-minus-1"])
def test_the_issues_damaged_demo_models_are_clear_errors_from_infer(cli, tmp_path, key, vtype, raw, words):
    """The three copies of the demo model that killed ``geniex infer`` with SIGABRT
    inside llama.cpp (issue 36)."""
    path = _demo_with(tmp_path, key, vtype, raw)
    proc = cli("infer", path, "-p", "hi", "--max-tokens", "4")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"error: {path} is not a usable model: {words}" + last.split(words, 1)[1], last


def test_a_vocabulary_without_a_tokenizer_refuses_text_instead_of_aborting(tmp_path):
    # The guard behind the session's check: a no_vocab file loaded on its own (as an
    # MTP draft is) says it cannot tokenize, where llama_tokenize would abort.
    import tiny_gemma4
    from geniex.errors import GenieXError
    from geniex.llama.objects import Model
    model = Model(tiny_gemma4.write_target(tmp_path / "t.gguf", vocab="none"))
    try:
        assert not model.vocab.has_tokenizer
        with pytest.raises(GenieXError, match="no tokenizer"):
            model.vocab.tokenize("hi")
    finally:
        model.close()
