"""Tiny random-weight Gemma-4 target + ``gemma4-assistant`` MTP draft, for tests.

No model hub is reachable from the build machines, and no MTP model small enough to
install exists in any registry, so tests make their own: a ``gemma4`` target (width
64, 2 layers, ~0.4 MB) and a matching ``gemma4-assistant`` draft (width 32, ~0.1 MB),
written with the ``gguf`` package in a few milliseconds. They run the library's real
MTP code path end to end. The weights are random (fixed numpy seeds, so the files are
byte-for-byte reproducible); the output is gibberish, but deterministic.

API: :func:`write_target`, :func:`write_assistant`, :func:`write_llama`,
:func:`make_pair`, :func:`make_mismatched`. CLI: ``python tests/support/tiny_gemma4.py OUTDIR``.

Facts beyond the usual recipe for a Gemma-4 assistant GGUF (checked against the
b11549 library in xllamacpp 2026.10.11549, via ctypes):

- Vocabulary: a 256-entry SPM (``tokenizer.ggml.model = "llama"``) vocab cannot hold
  all 256 ``<0xNN>`` byte tokens plus specials, so the 13 bytes that never occur in
  valid UTF-8 (0xC0, 0xC1, 0xF5-0xFF) and the printable ASCII bytes (which have
  character tokens) have no byte token. Keep ``<0x0A>``: without it the library
  still loads the vocab but logs "newline token not found" and uses ``<pad>`` as
  the newline token.
- ``<start_of_turn>``/``<end_of_turn>`` are CONTROL tokens; ``<end_of_turn>`` is
  recognised as an end-of-generation token by its text. The chat template contains
  ``<start_of_turn>``, which is what ``llama_chat_apply_template`` uses to detect the
  gemma format.
- The target's head rows of byte tokens and specials (except ``</s>`` and
  ``<end_of_turn>``) are shrunk, so greedy output is printable ASCII and ``</s>`` is
  reachable: with the defaults, greedy "The capital of France is" gives 8 tokens
  then ``</s>``, while "Once upon a time" runs past 64 tokens (``eos_boost`` > 1
  shortens outputs).
- The assistant embeds its input tokens with the *target's* ``token_embd`` (scaled by
  sqrt(target width)) and uses its own ``token_embd`` only as its output head. The
  library reports it with ``n_layer = 0`` (all its layers are NextN layers),
  ``llama_model_n_embd`` 32 and ``llama_model_n_embd_inp``/``_out`` 64.
- The target's NextN row (``llama_get_embeddings_nextn_ith``) is its hidden state
  after the final norm: L2 norm sqrt(64) = 8 with norm weights 1.

What each mismatched pair does inside the library when nothing validates it first
(see :func:`make_mismatched`; ``expected reason`` is the substring our own validation
must put in its error message):

- ``width`` (target width 48, assistant ``embedding_length_out`` 64; reason
  ``embedding_length_out``): both load; creating the MTP context **aborts the
  process** (SIGABRT, ``ggml.c: GGML_ASSERT(ggml_can_mul_mat(a, b))`` in graph
  reserve). ``llama_model_n_embd_inp(draft)`` = 64 vs ``llama_model_n_embd(target)``
  = 48 shows it beforehand.
- ``vocab`` (assistant 320 entries vs 256; reason ``vocab``): loads, the context is
  created and drafting works **silently** until the draft proposes an id >= 256: fed
  back to the draft it **aborts the process** (``ggml-cpu/ops.cpp:
  GGML_ASSERT(i01 >= 0 && i01 < ne01)``: the draft embeds tokens with the target's
  ``token_embd``); given to the target, ``llama_decode`` returns -1 ("invalid token").
- ``head_dim`` (assistant ``key_length`` 16 vs 32; reason ``key_length``): loads,
  context created, drafts produced: **silently** wrong (the draft views the shared
  target K/V with its own head size).
- ``swa_order`` (target pattern ``(False, True)``; reason ``sliding``): loads, context
  created, drafts produced: **silently** wrong (the draft's SWA layer shares the
  target's full-attention layer 0 and vice versa: other RoPE base, other mask).
- ``arch_gemma4`` / ``arch_llama`` (a plain ``gemma4`` or ``llama`` model as the draft;
  reason ``gemma4-assistant``): loads; ``llama_init_from_model`` with
  ``ctx_type = MTP`` returns NULL (log: "context type MTP requested but model doesn't
  contain MTP layers"). No crash.

The good pair (both ``aligned`` settings) loads, drafts, and a greedy speculative loop
(k = 1, 3, 5) reproduces plain greedy decoding exactly; the random pair's drafts are
(almost) never accepted, the aligned pair's about 55-85%.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

import gguf

ASSISTANT_ARCH = "gemma4-assistant"  # gguf 0.19 has no constant for it

# Post-norm weight of an aligned target's layers: how hard its layers (and so the
# context) pull the output away from what the aligned draft predicts.
ALIGNED_MIX = 0.02

# Token ids of the tiny SPM vocab (gemma's layout for the first four).
PAD_ID, EOS_ID, BOS_ID, UNK_ID, SOT_ID, EOT_ID = range(6)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# A few merges so the SPM tokenizer actually merges something (fills the vocab to 256).
_MERGES = ["\u2581t", "he", "\u2581the", "in", "er", "on", "\u2581a"]


def spm_vocab(size: int = 256) -> tuple[list[str], list[float], list[int]]:
    """Return ``(tokens, scores, token_types)`` of a tiny SPM vocab of ``size`` entries.

    Layout: 6 specials, byte tokens for every byte valid in UTF-8 that has no character
    token, U+2581 (the SPM space), printable ASCII, 7 merges; entries beyond 256 are
    ``<unused{i}>`` (type UNUSED) so larger vocabs can be made for mismatch tests.
    """
    T = gguf.TokenType
    tokens = ["<pad>", "</s>", "<s>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [T.CONTROL, T.CONTROL, T.CONTROL, T.UNKNOWN, T.CONTROL, T.CONTROL]
    # Bytes without a character token: control chars, DEL, and the non-ASCII bytes that
    # can occur in UTF-8 (SPM falls back to these for any character not in the vocab).
    byte_values = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xC0), *range(0xC2, 0xF5)]
    tokens += [f"<0x{b:02X}>" for b in byte_values]
    types += [T.BYTE] * len(byte_values)
    chars = ["\u2581"] + [chr(c) for c in range(0x21, 0x7F)]
    tokens += chars
    types += [T.NORMAL] * len(chars)
    tokens += _MERGES
    types += [T.NORMAL] * len(_MERGES)
    assert len(tokens) == 256, len(tokens)
    if size < 256:
        raise ValueError(f"the tiny SPM vocab needs at least 256 entries, got {size}")
    extra = size - 256
    tokens += [f"<unused{i}>" for i in range(extra)]
    types += [T.UNUSED] * extra
    # Scores only matter for merges (higher merges first); keep them distinct and
    # descending like a real SPM model, with merges scored above single characters.
    scores = [0.0] * len(tokens)
    n_base = 6 + len(byte_values)
    for i in range(n_base, n_base + len(chars)):
        scores[i] = -float(i)
    for j, i in enumerate(range(n_base + len(chars), 256)):
        scores[i] = -1.0 - j * 0.1
    for i in range(256, size):
        scores[i] = -1000.0 - i
    return tokens, scores, [int(t) for t in types]


def _add_vocab(w: gguf.GGUFWriter, vocab_size: int, *, chat_template: bool) -> None:
    tokens, scores, types = spm_vocab(vocab_size)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    # Gemma's tokenizer does not prepend a space to the text.
    w.add_add_space_prefix(False)
    if chat_template:
        w.add_chat_template(CHAT_TEMPLATE)


class _Weights:
    """Deterministic random tensors; numpy shapes are ggml ``{ne0, ne1}`` reversed."""

    def __init__(self, seed: int, f16: bool):
        self.rng = np.random.default_rng(seed)
        self.f16 = f16

    def matrix(self, ne0: int, ne1: int, scale: float | None = None) -> np.ndarray:
        # ~1/sqrt(fan_in) keeps every projection's output at unit-ish scale, so the
        # hidden states neither vanish nor blow up through the (RMS-normed) layers.
        std = scale if scale is not None else 1.0 / np.sqrt(ne0)
        a = (self.rng.standard_normal((ne1, ne0)) * std).astype(np.float32)
        return a.astype(np.float16) if self.f16 else a

    @staticmethod
    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)


def _default_pattern(n_layer: int, swa_pattern: Sequence[bool] | None) -> list[bool]:
    pattern = [True] * (n_layer - 1) + [False] if swa_pattern is None else list(swa_pattern)
    if len(pattern) != n_layer:
        raise ValueError(f"swa_pattern has {len(pattern)} entries for {n_layer} layers")
    return [bool(x) for x in pattern]


def _add_attention_hparams(w: gguf.GGUFWriter, *, n_layer: int, head_dim: int,
                           pattern: list[bool], n_head: int, n_head_kv: int,
                           context_length: int, sliding_window: int) -> None:
    w.add_context_length(context_length)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_key_length_swa(head_dim)
    w.add_value_length_swa(head_dim)
    w.add_sliding_window(sliding_window)
    w.add_sliding_window_pattern(pattern)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_dimension_count_swa(head_dim)
    w.add_rope_freq_base(1e6)
    w.add_rope_freq_base_swa(1e4)


def _read_tensor(path: str | Path, name: str) -> np.ndarray:
    """Return tensor ``name`` of a GGUF file as a float32 numpy array (numpy order)."""
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        if t.name == name:
            return np.array(t.data, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape)))
    raise KeyError(f"{path} has no tensor {name}")


def _write(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_target(path: str | Path, *, seed: int = 0, width: int = 64, n_layer: int = 2,
                 vocab: str = "spm", vocab_size: int = 256, head_dim: int = 32,
                 n_head: int = 2, n_head_kv: int = 1, ff: int = 128,
                 swa_pattern: Sequence[bool] | None = None, context_length: int = 512,
                 sliding_window: int = 16, untied_output: bool = True,
                 eos_boost: float = 1.0, printable_output: bool = True,
                 chat_template: bool = True, aligned: bool = False,
                 residual_mix: float = ALIGNED_MIX, f16: bool = False) -> Path:
    """Write a tiny random ``gemma4`` target model to ``path`` and return the path.

    ``swa_pattern`` gives one bool per layer (True = sliding-window); the default is
    all sliding except the last, i.e. ``(True, False)`` for two layers, which is what a
    ``gemma4-assistant`` needs (its SWA layers read the target's layer n-2, its full
    layers layer n-1). ``vocab`` is ``"spm"`` (tiny SPM vocab: text prompts and the
    chat template work) or ``"none"`` (``no_vocab``: feed token ids directly;
    ``llama_tokenize`` aborts). ``untied_output`` adds ``output.weight`` so greedy
    output is not an echo of the input; ``eos_boost`` scales that head's ``</s>`` row
    so greedy decoding can reach end-of-sequence; ``printable_output`` shrinks the
    head rows of byte tokens and specials other than ``</s>``/``<end_of_turn>`` so
    greedy output is printable ASCII. ``f16`` stores matrices as F16.

    ``aligned`` makes a target an ``align_with`` assistant (see
    :func:`write_assistant`) can predict: token embeddings live in the first
    ``width // 2`` dimensions only, and the post-attention/post-FFN norm weights are
    ``residual_mix`` instead of 1.0, so each layer only nudges the residual stream
    and the output is mostly a function of the current token ("bigram"). The nudges
    still depend on the context, so a wrong KV cache changes the output.
    """
    path = Path(path)
    pattern = _default_pattern(n_layer, swa_pattern)
    rnd = _Weights(seed, f16)
    w = gguf.GGUFWriter(path, "gemma4")
    w.add_name("tiny-gemma4-target")
    _add_attention_hparams(w, n_layer=n_layer, head_dim=head_dim, pattern=pattern,
                           n_head=n_head, n_head_kv=n_head_kv,
                           context_length=context_length, sliding_window=sliding_window)
    w.add_embedding_length(width)
    w.add_feed_forward_length(ff)
    # The loader reads this key unconditionally (0 = no per-layer input embeddings).
    w.add_embedding_length_per_layer_input(0)
    if vocab == "spm":
        _add_vocab(w, vocab_size, chat_template=chat_template)
    elif vocab == "none":
        w.add_tokenizer_model("no_vocab")
        w.add_vocab_size(vocab_size)
    else:
        raise ValueError(f"vocab must be 'spm' or 'none', got {vocab!r}")

    # Embeddings are scaled by sqrt(width) in the graph, so keep them small.
    embd = rnd.matrix(width, vocab_size, scale=0.1)
    if aligned:
        embd[:, width // 2:] = 0
    w.add_tensor("token_embd.weight", embd)
    post_norm = residual_mix if aligned else 1.0
    if untied_output:
        out = rnd.matrix(width, vocab_size)
        if vocab == "spm":
            if printable_output:
                # Near-zero rows never win the argmax (the others reach ~+3), so
                # greedy output stays printable text (no byte tokens or specials).
                _, _, types = spm_vocab(vocab_size)
                for t, typ in enumerate(types):
                    if typ != gguf.TokenType.NORMAL and t not in (EOS_ID, EOT_ID):
                        out[t] *= 0.05
            out[EOS_ID] *= eos_boost
        w.add_tensor("output.weight", out)
    w.add_tensor("output_norm.weight", rnd.ones(width))
    # Proportional-RoPE frequency factors of the full-attention layers; 1.0 = plain RoPE.
    w.add_tensor("rope_freqs.weight", rnd.ones(head_dim // 2))
    kv_dim = head_dim * n_head_kv
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", rnd.ones(width))
        w.add_tensor(b + "attn_q.weight", rnd.matrix(width, head_dim * n_head))
        w.add_tensor(b + "attn_k.weight", rnd.matrix(width, kv_dim))
        w.add_tensor(b + "attn_v.weight", rnd.matrix(width, kv_dim))
        w.add_tensor(b + "attn_output.weight", rnd.matrix(head_dim * n_head, width))
        w.add_tensor(b + "attn_q_norm.weight", rnd.ones(head_dim))
        w.add_tensor(b + "attn_k_norm.weight", rnd.ones(head_dim))
        w.add_tensor(b + "post_attention_norm.weight", rnd.ones(width) * post_norm)
        w.add_tensor(b + "ffn_norm.weight", rnd.ones(width))
        w.add_tensor(b + "ffn_gate.weight", rnd.matrix(width, ff))
        w.add_tensor(b + "ffn_up.weight", rnd.matrix(width, ff))
        w.add_tensor(b + "ffn_down.weight", rnd.matrix(ff, width))
        w.add_tensor(b + "post_ffw_norm.weight", rnd.ones(width) * post_norm)
        w.add_tensor(b + "layer_output_scale.weight", rnd.ones(1))
    _write(w)
    return path


def write_assistant(path: str | Path, *, seed: int = 1, target_width: int = 64,
                    vocab_size: int = 256, head_dim: int = 32, width: int = 32,
                    n_layer: int = 2, n_head: int = 2, n_head_kv: int = 1, ff: int = 64,
                    swa_pattern: Sequence[bool] | None = None, context_length: int = 512,
                    sliding_window: int = 16, align_with: str | Path | None = None,
                    f16: bool = False) -> Path:
    """Write a tiny random ``gemma4-assistant`` (MTP draft) model and return the path.

    ``target_width`` is written as ``embedding_length_out``: the width of the target
    hidden state the draft consumes and produces (must equal the target's
    ``embedding_length``; the library refuses it if it equals the draft's own
    ``width``). ``nextn_predict_layers`` is set to ``n_layer`` (the library asserts
    they are equal). The assistant has no K/V projections: it attends over the
    target's KV cache, so ``head_dim`` must match the target's.

    ``align_with`` names an ``aligned=True`` target file: the draft then predicts
    that target's "bigram" output (its layers add nothing, its pre-projection copies
    the first ``width`` dimensions of the target's token embedding, and its output
    head is the first ``width`` columns of the target's ``output.weight``), so most
    drafts are accepted, but not all (the target's layers still nudge its output).
    """
    path = Path(path)
    pattern = _default_pattern(n_layer, swa_pattern)
    rnd = _Weights(seed, f16)
    w = gguf.GGUFWriter(path, ASSISTANT_ARCH)
    w.add_name("tiny-gemma4-assistant")
    _add_attention_hparams(w, n_layer=n_layer, head_dim=head_dim, pattern=pattern,
                           n_head=n_head, n_head_kv=n_head_kv,
                           context_length=context_length, sliding_window=sliding_window)
    w.add_embedding_length(width)
    w.add_embedding_length_out(target_width)
    w.add_feed_forward_length(ff)
    w.add_nextn_predict_layers(n_layer)
    _add_vocab(w, vocab_size, chat_template=False)

    # Tied: the assistant's token_embd is only its output head (inputs are embedded
    # with the target's token_embd).
    head = rnd.matrix(width, vocab_size)
    # [target token embedding ; target hidden state] -> draft width, and back.
    pre = rnd.matrix(2 * target_width, width)
    post_norm = 1.0
    if align_with is not None:
        target_head = _read_tensor(align_with, "output.weight")
        target_embd = _read_tensor(align_with, "token_embd.weight")
        if (target_head.shape != (vocab_size, target_width)
                or np.any(target_embd[:, width:] != 0)):
            raise ValueError(f"{align_with} is not an aligned target for a width-{width} "
                             f"draft with vocab {vocab_size} (see write_target(aligned=True))")
        # The target's embeddings are zero past `width`, so its RMS norm over all
        # dims is a fixed multiple of the norm over the first `width` dims, which is
        # what the draft computes: the draft's logits are a positive multiple of the
        # target's "bigram" logits and have the same argmax.
        head = np.ascontiguousarray(target_head[:, :width]).astype(head.dtype)
        pre = np.zeros_like(pre)
        pre[np.arange(width), np.arange(width)] = 1.0
        post_norm = 0.0  # the draft's layers add nothing to the residual stream
    w.add_tensor("token_embd.weight", head)
    w.add_tensor("output_norm.weight", rnd.ones(width))
    w.add_tensor("rope_freqs.weight", rnd.ones(head_dim // 2))
    w.add_tensor("nextn.pre_projection.weight", pre)
    w.add_tensor("nextn.post_projection.weight", rnd.matrix(width, target_width))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", rnd.ones(width))
        w.add_tensor(b + "attn_q.weight", rnd.matrix(width, head_dim * n_head))
        w.add_tensor(b + "attn_output.weight", rnd.matrix(head_dim * n_head, width))
        w.add_tensor(b + "attn_q_norm.weight", rnd.ones(head_dim))
        w.add_tensor(b + "post_attention_norm.weight", rnd.ones(width) * post_norm)
        w.add_tensor(b + "ffn_norm.weight", rnd.ones(width))
        w.add_tensor(b + "ffn_gate.weight", rnd.matrix(width, ff))
        w.add_tensor(b + "ffn_up.weight", rnd.matrix(width, ff))
        w.add_tensor(b + "ffn_down.weight", rnd.matrix(ff, width))
        w.add_tensor(b + "post_ffw_norm.weight", rnd.ones(width) * post_norm)
        w.add_tensor(b + "layer_output_scale.weight", rnd.ones(1))
    _write(w)
    return path


def write_llama(path: str | Path, *, seed: int = 3, width: int = 64, n_layer: int = 2,
                vocab_size: int = 256, n_head: int = 2, n_head_kv: int = 1,
                ff: int = 128) -> Path:
    """Write a tiny random ``llama`` model (same vocab): a wrong-architecture draft."""
    path = Path(path)
    rnd = _Weights(seed, False)
    head_dim = width // n_head
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama")
    w.add_context_length(512)
    w.add_embedding_length(width)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    _add_vocab(w, vocab_size, chat_template=False)
    w.add_tensor("token_embd.weight", rnd.matrix(width, vocab_size, scale=0.1))
    w.add_tensor("output.weight", rnd.matrix(width, vocab_size))
    w.add_tensor("output_norm.weight", rnd.ones(width))
    for i in range(n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", rnd.ones(width))
        w.add_tensor(b + "attn_q.weight", rnd.matrix(width, width))
        w.add_tensor(b + "attn_k.weight", rnd.matrix(width, head_dim * n_head_kv))
        w.add_tensor(b + "attn_v.weight", rnd.matrix(width, head_dim * n_head_kv))
        w.add_tensor(b + "attn_output.weight", rnd.matrix(width, width))
        w.add_tensor(b + "ffn_norm.weight", rnd.ones(width))
        w.add_tensor(b + "ffn_gate.weight", rnd.matrix(width, ff))
        w.add_tensor(b + "ffn_up.weight", rnd.matrix(width, ff))
        w.add_tensor(b + "ffn_down.weight", rnd.matrix(ff, width))
    _write(w)
    return path


def make_pair(directory: str | Path, *, aligned: bool = False,
              context_length: int = 512) -> tuple[Path, Path]:
    """Write a matching pair into ``directory``: ``(target_path, assistant_path)``.

    The default pair is fully random: its drafts are (almost) never accepted, which
    exercises the rejection path. ``aligned=True`` writes a pair whose drafts are
    mostly accepted but not always (see ``write_target(aligned=True)``).
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    n = context_length
    if aligned:
        target = write_target(d / "tiny-gemma4-target-aligned.gguf", aligned=True, context_length=n)
        return target, write_assistant(d / "tiny-gemma4-assistant-aligned.gguf",
                                       align_with=target, context_length=n)
    return (write_target(d / "tiny-gemma4-target.gguf", context_length=n),
            write_assistant(d / "tiny-gemma4-assistant.gguf", context_length=n))


def make_mismatched(directory: str | Path) -> dict[str, tuple[Path, Path, str]]:
    """Write deliberately mismatched pairs into ``directory``.

    Returns ``{variant: (target_path, draft_path, expected_reason_substring)}``; the
    substring is what a pair validator's error message is expected to contain. Each
    variant differs from the good pair in exactly one respect:

    - ``width``: target width 48, assistant ``embedding_length_out`` still 64.
    - ``vocab``: assistant vocab of 320 entries against the target's 256.
    - ``head_dim``: assistant ``key_length`` (and value/SWA lengths) 16 against 32.
    - ``swa_order``: target pattern ``(False, True)``: last layer sliding-window.
    - ``arch_gemma4``: a plain ``gemma4`` model given as the draft.
    - ``arch_llama``: a ``llama`` model given as the draft.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    target, assistant = make_pair(d)
    return {
        "width": (write_target(d / "target-width48.gguf", width=48), assistant,
                  "embedding_length_out"),
        "vocab": (target, write_assistant(d / "assistant-vocab320.gguf", vocab_size=320),
                  "vocab"),
        "head_dim": (target, write_assistant(d / "assistant-head16.gguf", head_dim=16),
                     "key_length"),
        "swa_order": (write_target(d / "target-swa-last.gguf", swa_pattern=(False, True)),
                      assistant, "sliding"),
        "arch_gemma4": (target, write_target(d / "draft-plain-gemma4.gguf", seed=2),
                        "gemma4-assistant"),
        "arch_llama": (target, write_llama(d / "draft-llama.gguf"), "gemma4-assistant"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: write the pair and the mismatched variants into OUTDIR and print paths."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    args = ap.parse_args(argv)
    target, assistant = make_pair(args.outdir)
    print(f"pair\t{target}\t{assistant}")
    target, assistant = make_pair(args.outdir, aligned=True)
    print(f"aligned\t{target}\t{assistant}")
    for name, (t, a, reason) in make_mismatched(args.outdir).items():
        print(f"{name}\t{t}\t{a}\t{reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
