"""Turn SpecOptions into drafters for a freshly loaded target, or explain why not.

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
from geniex.speculative.options import FALLBACK, METHODS

log = logging.getLogger("geniex.speculative")



def build(target, spec, n_rs_seq=0, bundled_nextn=False):
    """Return ``(drafter or None, notes)`` for a :class:`~geniex.speculative.target.Target`;
    notes are sentences for ``--verbose`` (the fallback line is also logged once).
    ``n_rs_seq``: how far a recurrent target can roll back; ``bundled_nextn``: the target
    was loaded with its own NextN layers."""
    notes = []
    made = []
    try:
        unknown = [t for t in spec.types if t not in METHODS]
        if unknown:
            raise SpecSetupError(f"unknown speculative method {', '.join(unknown)} "
                                 f"(known: {', '.join(METHODS)})")
        # n-gram methods first: they cost nothing when they have no match.
        made.extend(ngram.make(t, spec) for t in spec.ngram_types)
        if spec.model_types:
            kind = spec.model_types[0]
            made.append(_model_drafter(target, spec, kind, bundled_nextn, notes))
            if len(spec.model_types) > 1:
                notes.append(f"only one model drafter is used: {kind}")
        longest = max((d.n_max for d in made), default=0)
        if target.model.recurrent and longest > n_rs_seq:
            raise SpecSetupError(f"this target's recurrent state can be rolled back by {n_rs_seq} "
                                 f"positions, fewer than a draft of {longest} tokens could need")
    except GenieXError as e:
        for d in made:
            d.close()
        log.warning("%s: %s", FALLBACK, e)
        return None, [f"{FALLBACK}: {e}"]
    drafter = made[0] if len(made) == 1 else DrafterChain(made)
    notes.insert(0, f"speculative decoding: {drafter.name}")
    if _float_matmuls(target.model.header):
        notes.append("note: this target's weights are F32/F16/BF16; llama.cpp multiplies a "
                     "many-row verify batch by them in another order than a one-row decode, so "
                     "speculative output can differ from plain output at near-ties (quantized "
                     "weights are bitwise exact; see docs/speculative.md, Identical output)")
    for n in notes:
        log.debug(n)
    return drafter, notes


FLOAT_TYPES = (0, 1, 30)   # GGML F32, F16, BF16


def _float_matmuls(header):
    """Whether the target's layer matrices are unquantized floats."""
    mats = [t for name, t in header.tensors.items() if name.startswith("blk.") and len(t.shape) == 2]
    return bool(mats) and sum(t.type in FLOAT_TYPES for t in mats) * 2 > len(mats)


def _model_drafter(target, spec, kind, bundled_nextn, notes):
    if not spec.draft_path:
        if kind == "draft-mtp":
            if bundled_nextn:
                from geniex.speculative.drafters.nextn import NextnDrafter
                notes.append(f"draft-mtp: using the {target.model.n_layer_nextn()} NextN "
                             f"layer(s) bundled in {target.name}")
                return NextnDrafter(target, spec.n_max, spec.n_min, spec.p_min)
            if target.model.header.arch_key("nextn_predict_layers"):
                raise SpecSetupError(
                    f"{target.name} declares NextN layers, but this llama.cpp build has no NextN "
                    f"draft graph for its architecture ({target.model.architecture}): bundled "
                    "MTP is not supported for it; give a separate MTP draft with --draft-model")
            raise SpecSetupError("draft-mtp needs a draft model (a gemma4-assistant GGUF trained for this target)")
        raise SpecSetupError(f"{kind} needs a draft model")
    header = read_header(spec.draft_path)
    draft_name = spec.draft_model or str(spec.draft_path)
    if pairing.is_assistant(header):
        if kind != "draft-mtp":
            notes.append(f"{draft_name} is an MTP assistant: using draft-mtp for --spec-type {kind}")
        pairing.check_mtp_pair(target.model.header, header, target.name, draft_name)
        from geniex.speculative.drafters.mtp import MtpAssistant
        model = Model(spec.draft_path, devices=None, n_gpu_layers=target.ngl, header=header)
        try:
            return MtpAssistant(target, model, spec.n_max, spec.n_min, spec.p_min)
        except BaseException:
            model.close()
            raise
    if kind == "draft-mtp":
        pairing.check_mtp_pair(target.model.header, header, target.name, draft_name)
    if kind == "draft-eagle3":
        raise SpecSetupError(f"{draft_name} is not an EAGLE-3 draft this library can run "
                             f"(architecture {header.architecture}); use draft-simple for a plain draft model")
    from geniex.speculative.drafters.draft_simple import DraftSimple
    model = Model(spec.draft_path, devices=None, n_gpu_layers=target.ngl, header=header)
    try:
        pairing.check_vocab_pair(target.vocab, model.vocab, target.name, draft_name)
        return DraftSimple(target, model, spec.n_max, spec.n_min, spec.p_min)
    except BaseException:
        model.close()
        raise
