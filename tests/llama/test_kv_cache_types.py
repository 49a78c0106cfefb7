"""KV cache types: names, the combinations we refuse, and the fact exactness rests on.

On 2+ threads, a one-row decode with an F16 cache sums attention in another order than
the rows of a multi-row batch once the KV window reaches 512 cells (ggml-cpu's split-KV
flash-attention path); with a q8_0 cache it does not. These tests pin both halves of
that on the real library and the demo model.

The window the kernel sees is the used cells padded up to a multiple of 256 (llama.cpp's
KV padding), so 257 cached cells already give a 512-cell window: a prompt of POS tokens
reaches the split-KV path at less than half the prefill of a 600-token one (at 200 cells,
a 256-cell window, F16 rows agree: measured, and in the reference's table).
"""
import numpy as np
import pytest

from geniex.errors import GenieXError, UsageError
from geniex.llama import cache_types, kv
from geniex.llama.kv import PROMPT_CHUNK
from geniex.llama.objects import Batch, Context, Model

# One-row decodes and batch rows on two threads (tests/support/parallel.py).
pytestmark = pytest.mark.all_cores

POS = 260          # past 256 cached cells: a 512-cell KV window, where the F16 split-KV path starts


def test_names_map_to_ggml_type_ids():
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.constants import GGMLQuantizationType as T
    assert list(cache_types.TYPES) == ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl",
                                       "q5_0", "q5_1"]
    for name, tid in cache_types.TYPES.items():
        assert T(tid).name.lower() == name
        assert cache_types.block_size(tid) == GGML_QUANT_SIZES[T(tid)][0]
        assert cache_types.parse(name) == tid and cache_types.name_of(tid) == name
    assert cache_types.parse(" Q8_0 ") == T.Q8_0
    with pytest.raises(UsageError, match=r"unknown KV cache type 'q3_k'.*f16, bf16, q8_0"):
        cache_types.parse("q3_k")
    with pytest.raises(UsageError):
        cache_types.parse(99)


def test_exactness_rule():
    f16, q8 = cache_types.TYPES["f16"], cache_types.TYPES["q8_0"]
    assert cache_types.exact_on_threads(f16, f16, 1)
    assert not cache_types.exact_on_threads(f16, f16, 2)
    assert cache_types.exact_on_threads(q8, q8, 8)
    assert cache_types.exact_on_threads(f16, q8, 2)   # the path needs both K and V unquantized


def test_quantized_v_without_flash_attention_is_refused():
    q8, f16 = cache_types.TYPES["q8_0"], cache_types.TYPES["f16"]
    with pytest.raises(GenieXError, match="needs flash attention"):
        cache_types.check(f16, q8, flash_attn=False)
    cache_types.check(q8, f16, flash_attn=False)     # a quantized K alone is fine


def test_head_width_not_a_multiple_of_the_block_is_refused_before_the_library(tmp_path):
    import tiny_gemma4
    model = Model(tiny_gemma4.write_target(tmp_path / "hd16.gguf", head_dim=16))
    assert cache_types.head_dims(model.header) == ([16], [16])
    with pytest.raises(GenieXError, match="q8_0 K cache needs head widths divisible by 32, this model has 16"):
        Context(model, n_ctx=256, type_k="q8_0", type_v="f16")
    Context(model, n_ctx=256, type_k="f16", type_v="f16").close()


@pytest.fixture(scope="module")
def demo(demo_model):
    """The demo model, loaded once for this module's contexts."""
    model = Model(demo_model)
    yield model
    model.close()


def test_demo_model_context_reports_its_cache_types(demo):
    model = demo
    assert cache_types.head_dims(model.header) == ([64], [64])
    ctx = Context(model, n_ctx=256, type_k="q8_0", type_v="q4_0")
    assert (ctx.type_k, ctx.type_v) == (cache_types.TYPES["q8_0"], cache_types.TYPES["q4_0"])
    # A context that reads another's KV inherits its types; a different explicit type is refused.
    with pytest.raises(GenieXError, match="must use its cache types"):
        Context(model, n_ctx=256, other=ctx, type_k="f16")
    ctx.close()
    assert Context(model, n_ctx=256).type_k == cache_types.F16


def _first_row_logits(ctx, batch, prompt, rows):
    """Decode ``prompt`` then ``rows`` at its end; logits of the first of ``rows`` (copied),
    leaving the cache as it was after the prompt."""
    ctx.decode(batch.fill(rows, len(prompt), all_logits=True))
    out = np.array(ctx.logits(0))
    ctx.trim(len(prompt))
    return out


def _one_vs_batches(model, type_kv, prompt, n_threads=2):
    # The prompt is decoded on 1 thread (2-thread batches crawl on a busy machine); only
    # the compared rows run on ``n_threads``: they all read the same cache contents.
    ctx = Context(model, n_ctx=1024, n_batch=512, n_ubatch=512, n_threads=1,
                  n_threads_batch=1, type_k=type_kv, type_v=type_kv)
    batch = Batch(512)
    for i in range(0, len(prompt), 512):
        ctx.decode(batch.fill(prompt[i:i + 512], i))
    ctx.set_threads(n_threads, n_threads)
    nxt = prompt[:5]
    one = _first_row_logits(ctx, batch, prompt, nxt[:1])
    two = _first_row_logits(ctx, batch, prompt, nxt[:2])
    five = _first_row_logits(ctx, batch, prompt, nxt[:5])
    ctx.close()
    return one, two, five


@pytest.fixture(scope="module", params=["Q4_1", "Q4_0"])
def demo_and_prompt(request, demo):
    model = demo if request.param == "Q4_1" else Model(request.getfixturevalue("demo_q4_0"))
    assert model.describe().endswith(request.param)
    return model, _prompt(model)


def _prompt(model):
    text = ("The library turns a model file into text one token at a time, and every token "
            "it writes is read back before the next one is chosen. ")
    tokens = model.vocab.tokenize(text * 40, add_special=True)[:POS]
    assert len(tokens) == POS
    return tokens


def test_q8_0_cache_one_row_decode_equals_batch_rows_on_two_threads(demo_and_prompt):
    model, prompt = demo_and_prompt
    one, two, five = _one_vs_batches(model, "q8_0", prompt)
    assert np.array_equal(one, two) and np.array_equal(two, five)


def test_f16_cache_one_row_decode_differs_on_two_threads_in_a_512_cell_window(demo):
    # The documented cause: ggml-cpu's split-KV flash attention for a single query row
    # with F16 K/V and a KV window of >= 512 cells. Multi-row batches still agree with each other.
    model = demo
    prompt = _prompt(model)
    one, two, five = _one_vs_batches(model, "f16", prompt)
    assert np.array_equal(two, five)
    assert not np.array_equal(one, two)
    assert np.abs(one - two).max() < 2.0        # a different summation order, not garbage


def test_thread_counts_can_change_between_decodes(demo):
    # llama_set_n_threads: what a loop uses to run one-row decodes and batches on
    # different thread counts (e.g. under a busy neighbour) without a new context.
    model = demo
    prompt = _prompt(model)
    ctx = Context(model, n_ctx=256, n_threads=1, n_threads_batch=1, type_k="q8_0", type_v="q8_0")
    assert ctx.threads == (1, 1)
    batch = Batch(64)
    ctx.decode(batch.fill(prompt[:40], 0))
    ctx.set_threads(1, 2)
    assert ctx.threads == (1, 2)
    ctx.decode(batch.fill(prompt[40:41], 40))
    one = np.array(ctx.logits(0))
    ctx.trim(40)
    ctx.decode(batch.fill(prompt[40:42], 40, all_logits=True))
    assert np.array_equal(one, ctx.logits(0))    # 1-thread row == row of a 2-thread batch
    ctx.close()


def _long_prompt(model, n):
    text = "Every token the library writes is read back before the next one is chosen. " * (n // 8)
    tokens = model.vocab.tokenize(text, add_special=True)[:n]
    assert len(tokens) == n
    return tokens


# The batch after a prompt: past the 64 rows from which an F16 cache's rows take a tiled
# kernel (at 63 rows they all equal their one-row decodes, at 65 none does).
ROWS = 70


def _context(model, kv_type):
    """A context of ``model`` on two threads, 512-row micro-batches, ``kv_type`` K and V."""
    return Context(model, n_ctx=1024, n_batch=1024, n_ubatch=512, n_threads=2, n_threads_batch=2,
                   type_k=kv_type, type_v=kv_type)


def _rows_after(ctx, batch, tokens, n, rows):
    """``tokens[n:n + rows]`` after the ``n`` in the cache: (the logits of each decoded
    alone, one at a time; of each row of them decoded as one batch)."""
    one = []
    for i in range(rows):
        ctx.decode(batch.fill(tokens[n + i:n + i + 1], n + i))
        one.append(np.array(ctx.logits(0)))
    ctx.trim(n)
    ctx.decode(batch.fill(tokens[n:n + rows], n, all_logits=True))
    return one, [np.array(ctx.logits(i)) for i in range(rows)]


@pytest.fixture(scope="module")
def chunked(demo):
    """A prompt of PROMPT_CHUNK + 40 tokens read by ``kv.prefill`` into a q8_0 cache (calls
    of PROMPT_CHUNK rows: 512-row micro-batches, llama.cpp's pace), then :data:`ROWS`
    tokens after it, one at a time and as one batch, in a 768-cell KV window (where an
    F16 cache's one-row decodes split attention per thread). Returns ``(tokens, n, the
    positions after each call, the one-row logits, the batch rows' logits)``. One
    prefill for the two tests below, each of which decodes the prompt another way and
    compares the next row (each prefilled the prompt itself, and a 600-token one)."""
    n = PROMPT_CHUNK + 40
    tokens = _long_prompt(demo, n + ROWS)
    ctx, batch, chunks = _context(demo, "q8_0"), Batch(1024), []
    kv.prefill(ctx, batch, tokens, 0, n, progress=chunks.append)
    one, batched = _rows_after(ctx, batch, tokens, n, ROWS)
    ctx.close()
    return tokens, n, chunks, one, batched


def _next_row_after(model, tokens, n, cut):
    """The logits of ``tokens[n]`` after ``tokens[:n]`` decoded in calls of ``cut`` rows
    into a q8_0 cache."""
    ctx, batch = _context(model, "q8_0"), Batch(1024)
    for start in range(0, n, cut):
        ctx.decode(batch.fill(tokens[start:min(start + cut, n)], start))
    ctx.decode(batch.fill(tokens[n:n + 1], n))
    out = np.array(ctx.logits(0))
    ctx.close()
    return out


def test_a_prompt_decoded_in_chunks_holds_the_bits_of_one_call(demo, chunked):
    """A prompt is decoded in calls of PROMPT_CHUNK rows (a cancelled prompt stops within
    one): the cache then holds the bits one call of the whole prompt writes, so the
    next row's logits are equal."""
    tokens, n, chunks, one, _ = chunked
    assert chunks == [PROMPT_CHUNK, n]
    assert np.array_equal(_next_row_after(demo, tokens, n, n), one[0])


def test_a_q8_0_cache_holds_the_same_bits_however_a_prompt_is_cut_and_a_row_is_batched(demo, chunked):
    """What lets a prompt decode in 512-row micro-batches (llama.cpp's pace) with answers
    that do not depend on what the cache held before: with a quantized cache, a prompt
    cut in 37- or 512-row calls leaves the same bits, and every row of a 70-row batch
    (past the 64 rows where an F16 cache changes kernels) equals its one-row decode."""
    q8 = cache_types.TYPES["q8_0"]
    assert cache_types.shape_free(q8, q8)
    tokens, n, _, one, batched = chunked
    assert [np.array_equal(a, b) for a, b in zip(one, batched, strict=True)] == [True] * ROWS
    assert np.array_equal(_next_row_after(demo, tokens, n, 37), one[0])


def test_an_f16_cache_changes_kernels_by_batch_shape(demo):
    # Why an F16 cache keeps 32-row micro-batches: from 64 rows its rows take a tiled
    # kernel that a one-row decode never matches. After a 128-token prompt the rows stay
    # in a 256-cell KV window, below the 512 cells from which one-row decodes split
    # attention per thread: only the batch's shape differs.
    f16 = cache_types.TYPES["f16"]
    assert not cache_types.shape_free(f16, f16)
    tokens = _long_prompt(demo, 128 + ROWS)
    ctx, batch = _context(demo, "f16"), Batch(1024)
    ctx.decode(batch.fill(tokens[:128], 0))
    one, batched = _rows_after(ctx, batch, tokens, 128, ROWS)
    ctx.close()
    assert sum(np.array_equal(a, b) for a, b in zip(one, batched)) < ROWS
