"""Embeddings and rerank scores from a model that declares a pooling, as llama.cpp's
server computes them.

A model is an embedding model when its GGUF declares ``{arch}.pooling_type``; the
session then keeps a second context on the same weights made with ``embeddings=true``
(:meth:`~geniex.engine.session.Session.embeddings_context`), whose decodes give one
pooled vector per input (or a vector per token for pooling ``none``). A reranker is a
model with pooling ``rank`` and a classifier head: its pooled output is the score.
Each input is decoded alone, in one batch of at most the context's batch size (as
llama.cpp's server needs: a pooled input cannot be split across batches).
"""
import numpy as np

from geniex.errors import Unsupported, UsageError
from geniex.llama import api

# Architectures whose graph builds a classifier head for rank pooling in b11549; for any
# other the library aborts the process while building the graph, so they are refused.
RANK_ARCHS = frozenset(("bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe",
                        "modern-bert", "neo-bert", "qwen3", "gemma-embedding"))


def declared_pooling(model):
    """The pooling the model's GGUF declares (an api.LLAMA_POOLING_TYPE_*), or None."""
    value = model.header.arch_key("pooling_type")
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def require_pooling(model, name, route="embeddings"):
    """The declared pooling, or :class:`Unsupported` naming the model and the key."""
    pooling = declared_pooling(model)
    if pooling is None:
        raise Unsupported(f"{name} declares no pooling ({model.architecture}.pooling_type is not in its GGUF): "
                          f"it is not an embedding model, so this server does not answer {route} with it")
    return pooling


def require_rank(model, name):
    """Raise :class:`Unsupported` unless the model is a reranker the library can run."""
    pooling = declared_pooling(model)
    if pooling != api.LLAMA_POOLING_TYPE_RANK or model.n_cls_out < 1 or model.architecture not in RANK_ARCHS:
        raise Unsupported(f"{name} is not a reranking model (it needs {model.architecture}.pooling_type = rank "
                          "and a classifier head); this server does not rerank with it")


def vectors(ctx, batch, tokens, n_embd, field="input"):
    """Decode ``tokens`` alone on the embeddings context ``ctx``: a list holding the one
    pooled vector, or one vector per token for pooling ``none``."""
    if not tokens:
        raise UsageError(f"{field}: the input is empty; send some text", param=field)
    if len(tokens) > ctx.n_batch:
        raise UsageError(f"{field}: the input has {len(tokens)} tokens, more than the {ctx.n_batch} an "
                         "embedding is computed over in one batch; shorten it", param=field)
    ctx.clear()
    ctx.decode(batch.fill(tokens, 0, all_logits=True))
    if ctx.pooling_type == api.LLAMA_POOLING_TYPE_NONE:
        return [ctx.embedding(n_embd, row=i) for i in range(len(tokens))]
    return [ctx.embedding(n_embd)]


def normalize(vec, kind=2):
    """llama.cpp's ``embd_normalize``: -1 none, 0 max absolute (to int16 range), 1
    taxicab, 2 euclidean (the default), >2 p-norm."""
    vec = np.asarray(vec, dtype=np.float64)
    if kind < 0:
        return vec
    if kind == 0:
        norm = np.abs(vec).max() / 32760.0
    elif kind == 1:
        norm = np.abs(vec).sum()
    elif kind == 2:
        norm = np.sqrt((vec * vec).sum())
    else:
        norm = (np.abs(vec) ** kind).sum() ** (1.0 / kind)
    return vec / norm if norm > 0 else np.zeros_like(vec)
