"""tests/support/gguf_edit.py: the byte-splicing GGUF copier behind the demo model's
variants (templates, FIM and pooling keys) gives the file gguf-py would
write, and the product's own GGUF checks accept it."""
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


def test_tensors_left_out_and_the_rest_realigned(target, tmp_path):
    keep = lambda name: not name.startswith("blk.1.")         # noqa: E731
    out = gguf_edit.edit(target, tmp_path / "one-layer.gguf", {"gemma4.block_count": 1}, keep)
    want = {k: (t, d.tobytes()) for k, (t, d) in data(target).items() if keep(k)}
    assert {k: (t, d.tobytes()) for k, (t, d) in data(out).items()} == want
    assert len(want) < len(data(target))
    header = read_header(out, check_model=False)      # offsets, sizes and alignment checked
    assert all(t.offset % 32 == 0 for t in header.tensors.values())
    assert header.metadata["gemma4.block_count"] == 1
