"""tests/support/requantize.py: a Q4_0 copy of the demo model made with gguf-py loads and answers."""
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q
from gguf.constants import LlamaFileType

from geniex.llama.gguf_file import read_header
from geniex.llama.objects import Batch, Context, Model


def test_copy_is_q4_0_by_file_type_and_tensor_types(demo_model, demo_q4_0):
    src, dst = read_header(demo_model), read_header(demo_q4_0)
    assert src.metadata["general.file_type"] == LlamaFileType.MOSTLY_Q4_1
    assert dst.metadata["general.file_type"] == LlamaFileType.MOSTLY_Q4_0
    assert set(dst.tensors) == set(src.tensors)
    for name, t in src.tensors.items():
        # Q4_1 weights become Q4_0; F32 norms and the Q8_0 embedding are kept as they were.
        want = Q.Q4_0 if t.type == Q.Q4_1 else t.type
        assert dst.tensors[name].type == want and dst.tensors[name].shape == t.shape
    assert sum(t.type == Q.Q4_0 for t in dst.tensors.values()) > 100
    # Everything but the tensors is copied: the tokenizer and chat template too.
    assert dst.metadata["tokenizer.chat_template"] == src.metadata["tokenizer.chat_template"]


def test_copy_loads_and_answers(demo_q4_0):
    model = Model(demo_q4_0)
    assert model.describe().endswith("Q4_0")      # llama.cpp's own reading of the file type
    ctx = Context(model, n_ctx=256, n_threads=1, n_threads_batch=1)
    batch = Batch(64)
    prompt = model.vocab.tokenize("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                                  "<|im_start|>assistant\n", add_special=True)
    ctx.decode(batch.fill(prompt, 0))
    out = []
    for i in range(8):
        tok = int(np.argmax(ctx.logits(-1)))
        out.append(tok)
        ctx.decode(batch.fill([tok], len(prompt) + i))
    assert "Paris" in model.vocab.detokenize(out)


def test_reuses_an_up_to_date_copy(demo_model, demo_q4_0):
    import requantize
    before = demo_q4_0.stat().st_mtime_ns
    assert requantize.requantize(demo_model, demo_q4_0) == demo_q4_0
    assert demo_q4_0.stat().st_mtime_ns == before
    with pytest.raises(ValueError, match="unknown target type"):
        requantize.requantize(demo_model, demo_q4_0, "q2_k")
