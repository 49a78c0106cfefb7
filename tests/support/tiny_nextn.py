"""Tiny random-weight ``qwen35`` target with one bundled NextN (MTP) layer, for tests.

The b11549 library (xllamacpp 2026.10.11549) has a NextN draft graph (``graph_mtp``)
for these architectures: qwen35, qwen35moe, qwen3next, qwen4exp, glm4moe, glm-dsa,
glm5-next, deepseek2, deepseek32, deepseek4, mimo2, step35, hy_v3, cohere2moe,
bailingmoe3, nemotron_h_moe (class names ``llama_model_<arch>::graph_mtp`` in the
shared object). ``qwen35`` is the only one with a dense FFN (the others are MoE and/or
MLA), so it is the simplest: its trunk is hybrid (gated delta-net layers, with a full
attention layer every ``full_attention_interval`` layers) and its NextN block is one
dense full-attention decoder block stored after the trunk as ``blk.{n_layer}``.

Here ``full_attention_interval = 1``: every trunk layer is a full-attention layer, so
no gated delta-net tensor is needed (the ``ssm.*`` keys must still be present: the
loader reads them unconditionally).

API: :func:`write_target`. CLI: ``python tests/support/tiny_nextn.py OUTDIR``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

import gguf

from tiny_gemma4 import EOS_ID, _add_vocab, _Weights, _write, spm_vocab

ARCH = "qwen35"


def write_target(path: str | Path, *, seed: int = 0, width: int = 64, n_layer: int = 2,
                 vocab_size: int = 256, head_dim: int = 32, n_head: int = 2,
                 n_head_kv: int = 1, ff: int = 128, context_length: int = 512,
                 nextn: bool = True, nextn_layers: int = 1, shared_head: bool = False,
                 full_attention_interval: int = 2, d_state: int = 16, n_group: int = 2,
                 n_v_heads: int = 2, d_conv: int = 4,
                 printable_output: bool = True, eos_boost: float = 1.0,
                 f16: bool = False) -> Path:
    """Write a tiny random ``qwen35`` model with ``n_layer`` trunk layers and (if
    ``nextn``) ``nextn_layers`` NextN blocks after them; return the path.

    ``nextn=False`` writes the same trunk without NextN layers or metadata.
    ``shared_head`` adds the optional ``nextn.shared_head_head``/``_norm`` tensors
    (without them the NextN block uses the trunk's ``output`` and ``output_norm``).
    """
    path = Path(path)
    rnd = _Weights(seed, f16)
    n_nextn = nextn_layers if nextn else 0
    n_all = n_layer + n_nextn
    w = gguf.GGUFWriter(path, ARCH)
    w.add_name("tiny-qwen35-nextn" if nextn else "tiny-qwen35")
    w.add_context_length(context_length)
    w.add_block_count(n_all)
    w.add_embedding_length(width)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(1e6)
    # M-RoPE sections (required by the loader); all on the first (text) section.
    w.add_rope_dimension_sections([head_dim // 2, 0, 0, 0])
    # Gated delta-net (linear attention) layers: every layer i with
    # (i + 1) % full_attention_interval != 0 (the NextN block is always full attention).
    key_dim, value_dim = d_state * n_group, d_state * n_v_heads
    conv_dim = 2 * key_dim + value_dim
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(value_dim)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(n_v_heads)
    w.add_ssm_group_count(n_group)
    w.add_uint32(gguf.Keys.LLM.FULL_ATTENTION_INTERVAL.format(arch=ARCH), full_attention_interval)
    if n_nextn:
        w.add_uint32(gguf.Keys.LLM.NEXTN_PREDICT_LAYERS.format(arch=ARCH), n_nextn)
    _add_vocab(w, vocab_size, chat_template=False)

    w.add_tensor("token_embd.weight", rnd.matrix(width, vocab_size, scale=0.5))
    out = rnd.matrix(width, vocab_size)
    if printable_output:
        _, _, types = spm_vocab(vocab_size)
        for t, typ in enumerate(types):
            if typ != gguf.TokenType.NORMAL and t != EOS_ID:
                out[t] *= 0.05
    out[EOS_ID] *= eos_boost
    w.add_tensor("output.weight", out)
    w.add_tensor("output_norm.weight", rnd.ones(width))
    kv_dim = head_dim * n_head_kv
    for i in range(n_all):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", rnd.ones(width))
        w.add_tensor(b + "post_attention_norm.weight", rnd.ones(width))
        w.add_tensor(b + "ffn_gate.weight", rnd.matrix(width, ff))
        w.add_tensor(b + "ffn_up.weight", rnd.matrix(width, ff))
        w.add_tensor(b + "ffn_down.weight", rnd.matrix(ff, width))
        if i < n_layer and (i + 1) % full_attention_interval != 0:
            w.add_tensor(b + "attn_qkv.weight", rnd.matrix(width, conv_dim))
            w.add_tensor(b + "attn_gate.weight", rnd.matrix(width, value_dim))
            w.add_tensor(b + "ssm_conv1d.weight", rnd.matrix(d_conv, conv_dim, scale=0.5))
            w.add_tensor(b + "ssm_dt.bias", (rnd.rng.standard_normal(n_v_heads) * 0.1).astype(np.float32))
            # A = -exp(A_log) < 0: a decaying state.
            w.add_tensor(b + "ssm_a", -np.exp(rnd.rng.uniform(-1, 0.5, n_v_heads)).astype(np.float32))
            w.add_tensor(b + "ssm_beta.weight", rnd.matrix(width, n_v_heads))
            w.add_tensor(b + "ssm_alpha.weight", rnd.matrix(width, n_v_heads))
            w.add_tensor(b + "ssm_norm.weight", rnd.ones(d_state))
            w.add_tensor(b + "ssm_out.weight", rnd.matrix(value_dim, width))
            continue
        # Q and its output gate, interleaved per head: {width, 2 * head_dim * n_head}.
        w.add_tensor(b + "attn_q.weight", rnd.matrix(width, 2 * head_dim * n_head))
        w.add_tensor(b + "attn_k.weight", rnd.matrix(width, kv_dim))
        w.add_tensor(b + "attn_v.weight", rnd.matrix(width, kv_dim))
        w.add_tensor(b + "attn_output.weight", rnd.matrix(head_dim * n_head, width))
        w.add_tensor(b + "attn_q_norm.weight", rnd.ones(head_dim))
        w.add_tensor(b + "attn_k_norm.weight", rnd.ones(head_dim))
        if i >= n_layer:
            w.add_tensor(b + "nextn.eh_proj.weight", rnd.matrix(2 * width, width))
            w.add_tensor(b + "nextn.enorm.weight", rnd.ones(width))
            w.add_tensor(b + "nextn.hnorm.weight", rnd.ones(width))
            if shared_head:
                w.add_tensor(b + "nextn.shared_head_head.weight", rnd.matrix(width, vocab_size))
                w.add_tensor(b + "nextn.shared_head_norm.weight", rnd.ones(width))
    _write(w)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", type=Path)
    args = ap.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    for name, kw in (("tiny-qwen35-nextn.gguf", {}), ("tiny-qwen35.gguf", {"nextn": False})):
        p = write_target(args.outdir / name, **kw)
        print(p, p.stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
