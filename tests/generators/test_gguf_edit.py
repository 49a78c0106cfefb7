"""tests/support/gguf_edit.py: the byte-splicing GGUF copier behind the demo model's
variants (templates, FIM and pooling keys) and the Q4_0 copy gives the file gguf-py
would write, and the product's own GGUF checks accept it."""
import gguf
import numpy as np
import pytest

import gguf_edit
import tiny_gemma4 as tg
from geniex.llama.gguf_file import read_header

pytestmark = pytest.mark.fast   # a 0.4 MB generated model: the fast tier


def fields(path):
    return {k: (f.types, f.contents()) for k, f in gguf.GGUFReader(path).fields.items()
            if not k.startswith("GGUF.")}


def data(path):
    return {t.name: (t.tensor_type, np.array(t.data)) for t in gguf.GGUFReader(path).tensors}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tg.make_pair(tmp_path_factory.mktemp("edit"))[0]


def test_keys_are_set_added_and_kept(target, tmp_path):
    out = gguf_edit.edit(target, tmp_path / "out.gguf", {"tokenizer.chat_template": "{{ x }}",
                                                          "gemma4.block_count": 2, "new.key": 7, "new.text": "t"})
    before, after = fields(target), fields(out)
    assert after.pop("tokenizer.chat_template")[1] == "{{ x }}"
    assert after.pop("new.key") == ([gguf.GGUFValueType.UINT32], 7)
    assert after.pop("new.text") == ([gguf.GGUFValueType.STRING], "t")
    before.pop("tokenizer.chat_template", None)
    assert after == before                       # every other key as it was, types included
    assert {k: (t, d.tobytes()) for k, (t, d) in data(out).items()} == \
        {k: (t, d.tobytes()) for k, (t, d) in data(target).items()}
    assert read_header(out).metadata["tokenizer.chat_template"] == "{{ x }}"


def test_converted_tensors_change_size_and_the_rest_are_realigned(target, tmp_path):
    def convert(name, dims, ggml_type):
        if ggml_type != 0 or len(dims) != 1:           # F32 vectors (the norms) to F16
            return None
        return lambda raw: (1, np.frombuffer(raw, dtype=np.float32).astype(np.float16).tobytes())
    out = gguf_edit.edit(target, tmp_path / "f16-norms.gguf", convert=convert)
    before, after = data(target), data(out)
    changed = {k for k, (t, _) in before.items() if t == 0 and before[k][1].ndim == 1}
    assert changed and set(after) == set(before)
    for k, (t, d) in after.items():
        if k in changed:
            assert t == 1 and np.array_equal(d, before[k][1].astype(np.float16))
        else:
            assert (t, d.tobytes()) == (before[k][0], before[k][1].tobytes())
    header = read_header(out, check_model=False)      # offsets, sizes and alignment checked
    assert all(t.offset % 32 == 0 for t in header.tensors.values())


def test_split_writes_shards_as_llama_gguf_split_does(target, tmp_path):
    shards = gguf_edit.split(target, tmp_path / "m-00001-of-00003.gguf")
    assert [p.name for p in shards] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    V = gguf.GGUFValueType
    keys = [fields(p) for p in shards]
    for i, k in enumerate(keys):
        assert (k.pop("split.no"), k.pop("split.count")) == (([V.UINT16], i), ([V.UINT16], 3))
        assert k.pop("split.tensors.count") == ([V.INT32], len(data(target)))
    assert keys[0] == fields(target) and keys[1] == keys[2] == {}     # the metadata is the first's
    parts = [data(p) for p in shards]
    assert all(parts) and sum(map(len, parts)) == len(data(target))
    assert {k: (t, d.tobytes()) for part in parts for k, (t, d) in part.items()} == \
        {k: (t, d.tobytes()) for k, (t, d) in data(target).items()}
    read_header(shards[0])                            # the product's checks read every shard
    with pytest.raises(ValueError, match="not the first of several shards"):
        gguf_edit.split(target, tmp_path / "m.gguf")
