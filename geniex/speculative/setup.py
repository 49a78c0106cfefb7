"""Turn SpecOptions into drafters for a fresh Session, or explain why not.

Setup failure is never fatal, as in GenieX: the reason is logged with
``speculative decoding setup failed; falling back to plain decoding`` and the session
answers plainly.
"""
import logging

from geniex.errors import GenieXError, SpecSetupError
from geniex.llama.gguf_file import read_header
from geniex.llama.objects import Model
from geniex.speculative import pairing
from geniex.speculative.drafters import ngram
from geniex.speculative.drafters.base import DrafterChain

log = logging.getLogger("geniex.speculative")

FALLBACK = "speculative decoding setup failed; falling back to plain decoding"
MODEL_TYPES = ("draft-mtp", "draft-simple", "draft-eagle3")
NGRAM_TYPES = tuple(ngram.CLASSES)
KNOWN = MODEL_TYPES + NGRAM_TYPES


def longest_draft(spec):
    """The most tokens any requested method may draft in one step (what a recurrent
    target must be able to roll back)."""
    caps = [spec.n_max for t in spec.types if t in MODEL_TYPES]
    caps += [spec.ngram_max or ngram.DEFAULTS[t][2] for t in spec.types if t in NGRAM_TYPES]
    return max(caps, default=0)


def build(session, spec):
    """Return ``(drafter or None, notes)``; notes are sentences for ``--verbose``."""
    notes = []
    made = []
    try:
        unknown = [t for t in spec.types if t not in KNOWN]
        if unknown:
            raise SpecSetupError(f"unknown --spec-type {', '.join(unknown)} (known: {', '.join(KNOWN)})")
        # n-gram methods first: they cost nothing when they have no match.
        for t in spec.types:
            if t in NGRAM_TYPES:
                made.append(ngram.make(t, spec))
        model_types = [t for t in spec.types if t in MODEL_TYPES]
        if model_types:
            made.append(_model_drafter(session, spec, model_types[0], notes))
            if len(model_types) > 1:
                notes.append(f"only one model drafter is used: {model_types[0]}")
        rs = getattr(session, "n_rs_seq", 0)
        if session.model.recurrent and made and max(d.cap for d in made) > rs:
            raise SpecSetupError(f"this target's recurrent state can be rolled back by {rs} "
                                 f"positions, fewer than a draft of "
                                 f"{max(d.cap for d in made)} tokens could need")
    except GenieXError as e:
        for d in made:
            d.close()
        log.warning("%s: %s", FALLBACK, e)
        return None, [f"{FALLBACK}: {e}"]
    drafter = made[0] if len(made) == 1 else DrafterChain(made)
    notes.insert(0, f"speculative decoding: {drafter.name}")
    if _float_matmuls(session.model.header):
        notes.append("note: this target's weights are F32/F16/BF16; llama.cpp multiplies a "
                     "many-row verify batch by them in another order than a one-row decode, so "
                     "speculative output can differ from plain output at near-ties (quantized "
                     "weights are bitwise exact; see README, Identical output)")
    for n in notes:
        log.debug(n)
    return drafter, notes


FLOAT_TYPES = (0, 1, 30)   # GGML F32, F16, BF16


def _float_matmuls(header):
    """Whether the target's layer matrices are unquantized floats."""
    mats = [t for name, t in header.tensors.items() if name.startswith("blk.") and len(t.shape) == 2]
    return bool(mats) and sum(t.type in FLOAT_TYPES for t in mats) * 2 > len(mats)


def _model_drafter(session, spec, kind, notes):
    if not spec.draft_path:
        if kind == "draft-mtp":
            if getattr(session, "bundled_nextn", False):
                from geniex.speculative.drafters.nextn import NextnDrafter
                notes.append(f"draft-mtp: using the {session.model.n_layer_nextn()} NextN "
                             f"layer(s) bundled in {session.name}")
                return NextnDrafter(session, spec.n_max, spec.p_min)
            if session.model.header.arch_key("nextn_predict_layers"):
                raise SpecSetupError(
                    f"{session.name} declares NextN layers, but this llama.cpp build has no NextN "
                    f"draft graph for its architecture ({session.model.architecture}): bundled "
                    "MTP is not supported for it; give a separate MTP draft with --draft-model")
            raise SpecSetupError("draft-mtp needs --draft-model (a gemma4-assistant GGUF trained for this target)")
        raise SpecSetupError(f"{kind} needs --draft-model")
    header = read_header(spec.draft_path)
    draft_name = spec.draft_model or str(spec.draft_path)
    if pairing.is_assistant(header):
        if kind != "draft-mtp":
            notes.append(f"{draft_name} is an MTP assistant: using draft-mtp for --spec-type {kind}")
        pairing.check_mtp_pair(session.model.header, header, session.name, draft_name)
        from geniex.speculative.drafters.mtp import MtpDrafter
        model = Model(spec.draft_path, devices=None, n_gpu_layers=session.options.ngl, header=header)
        try:
            return MtpDrafter(session, model, spec.n_max, spec.p_min)
        except BaseException:
            model.close()
            raise
    if kind == "draft-mtp":
        pairing.check_mtp_pair(session.model.header, header, session.name, draft_name)
    if kind == "draft-eagle3":
        raise SpecSetupError(f"{draft_name} is not an EAGLE-3 draft this library can run "
                             f"(architecture {header.architecture}); use draft-simple for a plain draft model")
    from geniex.speculative.drafters.model import DraftModelDrafter
    model = Model(spec.draft_path, devices=None, n_gpu_layers=session.options.ngl, header=header)
    try:
        pairing.check_vocab_pair(session.vocab, model.vocab, session.name, draft_name)
        return DraftModelDrafter(session, model, spec.n_max, spec.p_min)
    except BaseException:
        model.close()
        raise
