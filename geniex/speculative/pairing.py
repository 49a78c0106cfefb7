"""Checks that a target and a draft belong together, from GGUF metadata and vocabularies.

They run before any draft context exists, because the library does not fail politely
on a mismatched pair: a width mismatch aborts the process while the MTP context is
built, a vocabulary mismatch aborts it mid-draft, and head-size or layer-pattern
mismatches silently read the wrong KV layers (see tests/support/tiny_gemma4.py).
"""
from geniex.errors import SpecSetupError

ASSISTANT_ARCH = "gemma4-assistant"
MTP_TARGET_ARCHS = ("gemma4",)


def _vocab_size(header):
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        return header.arch_key("vocab_size")
    return len(tokens) if isinstance(tokens, list) else int(tokens)


def is_assistant(header):
    """Whether a GGUF is a Gemma-4 MTP assistant (a draft that reads the target's KV)."""
    return header.architecture == ASSISTANT_ARCH


def check_mtp_pair(target, draft, target_name, draft_name):
    """Raise SpecSetupError naming both models and what differs, or return None.

    ``target`` and ``draft`` are :class:`~geniex.llama.gguf_file.GGUFHeader` objects.
    """
    where = f"draft {draft_name} does not fit target {target_name}"
    if draft.architecture != ASSISTANT_ARCH:
        raise SpecSetupError(f"{where}: draft-mtp needs a {ASSISTANT_ARCH} draft trained for this "
                             f"target; the draft's architecture is {draft.architecture or 'unknown'}")
    if target.architecture not in MTP_TARGET_ARCHS:
        raise SpecSetupError(f"{where}: a {ASSISTANT_ARCH} draft reads a gemma4 target's KV cache; "
                             f"this target's architecture is {target.architecture}")
    want_width = draft.arch_key("embedding_length_out")
    width = target.arch_key("embedding_length")
    if want_width != width:
        raise SpecSetupError(f"{where}: the draft expects a target of width {want_width} "
                             f"(its embedding_length_out); this target has width {width} "
                             f"(embedding_length)")
    dv, tv = _vocab_size(draft), _vocab_size(target)
    if dv != tv:
        raise SpecSetupError(f"{where}: the draft's vocabulary has {dv} tokens; the target's has {tv}")
    for key in ("attention.key_length", "attention.value_length",
                "attention.key_length_swa", "attention.value_length_swa", "attention.head_count_kv"):
        d, t = draft.arch_key(key), target.arch_key(key)
        if d is not None and t is not None and d != t:
            raise SpecSetupError(f"{where}: the draft expects {key} {d}; this target has {t}")
    pattern = target.arch_key("attention.sliding_window_pattern")
    n_layer = target.arch_key("block_count")
    if isinstance(pattern, list) and len(pattern) >= 2:
        if not (pattern[-2] and not pattern[-1]):
            raise SpecSetupError(
                f"{where}: the draft reads the target's last two layers as sliding-window then "
                f"full attention; this target's last two layers are "
                f"{'sliding-window' if pattern[-2] else 'full'} then {'sliding-window' if pattern[-1] else 'full'}")
    elif n_layer is not None and n_layer < 2:
        raise SpecSetupError(f"{where}: the target has fewer than two layers")
    dpattern = draft.arch_key("attention.sliding_window_pattern")
    if isinstance(dpattern, list) and (all(dpattern) or not any(dpattern)):
        raise SpecSetupError(f"{where}: the draft needs both a sliding-window and a full-attention layer")


def check_vocab_pair(target_vocab, draft_vocab, target_name, draft_name):
    """draft-simple: the draft must tokenize exactly like the target.

    Checked like upstream llama.cpp: same specials and add-BOS behaviour, sizes within
    128, and the same text for every token id both have (from id 5, where tokenizers
    keep their specials). Unlike upstream, the draft's vocabulary may not be larger:
    it could propose ids the target has no row for. Raises SpecSetupError naming the first difference.
    """
    where = f"draft {draft_name} cannot draft for {target_name}"
    if draft_vocab.n_tokens > target_vocab.n_tokens:
        # The draft could propose ids the target has no row for (llama_decode fails).
        raise SpecSetupError(f"{where}: the draft's vocabulary has {draft_vocab.n_tokens} tokens, more "
                             f"than the target's {target_vocab.n_tokens}")
    if abs(target_vocab.n_tokens - draft_vocab.n_tokens) > 128:
        raise SpecSetupError(f"{where}: vocabulary sizes differ ({draft_vocab.n_tokens} vs "
                             f"{target_vocab.n_tokens} tokens)")
    for what in ("bos", "eos", "add_bos"):
        d, t = getattr(draft_vocab, what), getattr(target_vocab, what)
        if d != t:
            raise SpecSetupError(f"{where}: the draft's {what} is {d}; the target's is {t}")
    for tok in range(5, min(target_vocab.n_tokens, draft_vocab.n_tokens)):
        if target_vocab.text(tok) != draft_vocab.text(tok):
            raise SpecSetupError(f"{where}: token {tok} is {draft_vocab.text(tok)!r} in the draft "
                                 f"but {target_vocab.text(tok)!r} in the target")
