"""KV cache element types, named as llama.cpp's ``--cache-type-k/-v`` (``-ctk/-ctv``) name them.

The one place that maps those names to ggml type ids and knows which combinations the
library accepts. Why the type matters beyond memory: with F16/F32 K/V, ggml's CPU flash
attention splits the keys of a one-row decode across threads once the KV window reaches
512 cells, so on 2+ threads a one-row decode sums attention in another order than any
row of a multi-row batch. A quantized (q8_0...) or bf16 cache takes the same path for
both, which is what makes one-row decodes on every core bitwise equal to verify rows (see
the "Identical output" section of docs/speculative.md). An f32 cache is no escape:
under flash attention llama.cpp casts it to F16 before attention (same logits as f16).
"""
from geniex.errors import GenieXError, UsageError

# Exactly the set llama.cpp's -ctk/-ctv accept (common/arg.cpp, kv_cache_types), in its
# order: name -> (enum ggml_type id, elements per block). Written out rather than read
# from the gguf package (which the CLI would then import on every start); a test checks
# them against gguf's GGMLQuantizationType and GGML_QUANT_SIZES.
_TABLE = {
    "f32": (0, 1),
    "f16": (1, 1),
    "bf16": (30, 1),
    "q8_0": (8, 32),
    "q4_0": (2, 32),
    "q4_1": (3, 32),
    "iq4_nl": (20, 32),
    "q5_0": (6, 32),
    "q5_1": (7, 32),
}
TYPES = {name: type_id for name, (type_id, _) in _TABLE.items()}
NAMES = {v: k for k, v in TYPES.items()}
_BLOCK = {type_id: block for type_id, block in _TABLE.values()}
F16 = TYPES["f16"]          # the library's default (llama_context_default_params)

# Types whose one-row decodes on several threads take the split-KV flash-attention path
# (ggml-cpu ops.cpp, use_split_kv_path: K/V F32 or F16, one query row, >= 512 KV cells).
SPLIT_KV_TYPES = frozenset({TYPES["f32"], TYPES["f16"]})


def parse(name):
    """A cache type name (``q8_0``, ``F16``...) -> its ggml type id.

    Raises UsageError naming the accepted values for anything else.
    """
    if isinstance(name, int) and not isinstance(name, bool):
        if name in NAMES:
            return name
        raise UsageError(f"unknown KV cache type id {name}")
    key = str(name).strip().lower()
    if key not in TYPES:
        raise UsageError(f"unknown KV cache type {name!r}: use one of {', '.join(TYPES)}")
    return TYPES[key]


def name_of(type_id):
    """ggml type id -> llama.cpp's name for it (``8`` -> ``q8_0``)."""
    return NAMES.get(type_id, f"type {type_id}")


def block_size(type_id):
    """Elements per block: 1 for f32/f16/bf16, 32 for the quantized types."""
    return _BLOCK[type_id]


def is_quantized(type_id):
    return block_size(type_id) > 1


def exact_on_threads(type_k, type_v, n_threads):
    """Whether one-row decodes on ``n_threads`` are bitwise equal to rows of a multi-row
    batch at any context length (an F16/F32 cache on 2+ threads is, only below 512 cells)."""
    return n_threads <= 1 or shape_free(type_k, type_v)


def shape_free(type_k, type_v):
    """Whether a row's logits and KV entries are the same bits in a batch of any size,
    however a prompt is cut into micro-batches: true unless K and V are both F16/F32,
    whose flash attention takes other kernels by batch shape (the split-KV path of one
    row on several threads, a tiled kernel from 64 rows in a micro-batch). Measured on
    the demo model with a q8_0 cache: prompts cut in 32, 64, 100 or 512 rows give the
    same bits, and every row of a 17-, 70- or 100-row verify equals its one-row decode
    (tests/llama/test_kv_cache_types.py)."""
    return not (type_k in SPLIT_KV_TYPES and type_v in SPLIT_KV_TYPES)


def head_dims(header):
    """The K and V head widths a model's attention layers use, from its GGUF header:
    every ``attention.key_length*`` / ``value_length*`` value (SWA layers may differ),
    else ``embedding_length / head_count``."""
    meta, arch = header.metadata, header.architecture
    k, v = set(), set()
    for key, value in meta.items():
        if not key.startswith(f"{arch}.attention.") or not isinstance(value, int):
            continue
        tail = key[len(arch) + len(".attention."):]
        if tail.startswith("key_length"):
            k.add(value)
        elif tail.startswith("value_length"):
            v.add(value)
    if not k or not v:
        n_embd, n_head = header.arch_key("embedding_length"), header.arch_key("attention.head_count")
        if isinstance(n_head, list):     # per-layer head counts
            n_head = max(n_head) if n_head else None
        if n_embd and n_head:
            k = k or {n_embd // n_head}
            v = v or {n_embd // n_head}
    return sorted(k), sorted(v)


def check(type_k, type_v, *, header=None, flash_attn=True):
    """Refuse, with a GenieXError, a K/V cache type combination the library would reject.

    - a quantized V cache needs flash attention (without it llama.cpp stores V transposed
      and cannot quantize it; it refuses the context with "quantized V cache requires
      flash_attn");
    - with flash attention, a quantized type's block (32 elements) must divide the head
      width (llama.cpp refuses "K cache type ... does not divide n_embd_head_k").
    ``header`` (a GGUFHeader) gives the head widths; without it only the first rule is checked.
    """
    for t in (type_k, type_v):
        if t not in NAMES:
            raise UsageError(f"unknown KV cache type id {t}")
    if is_quantized(type_v) and not flash_attn:
        raise GenieXError(f"a quantized V cache ({name_of(type_v)}) needs flash attention, which is "
                          "off for this context: use --cache-type-v f16 (or bf16/f32)")
    if header is None:
        return
    dims_k, dims_v = head_dims(header)
    for which, t, dims in (("K", type_k, dims_k), ("V", type_v, dims_v)):
        bad = [d for d in dims if d % block_size(t)]
        if bad:
            raise GenieXError(
                f"{header.path.name}: a {name_of(t)} {which} cache needs head widths divisible by "
                f"{block_size(t)}, this model has {bad[0]}: use --cache-type-{which.lower()} f16")
