"""A request's own speculative settings, answered on the model as it is loaded.

A loaded model's drafters are built for the setup it was loaded with (``serve``'s
``--spec-*`` flags, or the first request's ``spec_*`` fields). Only a draft model costs a
load: its weights and a context per slot. Everything else a request may set is a
setting of an answer: which n-gram methods draft (an n-gram drafter is a table built
from the text as it goes), how long drafts may be, the probability floor, the draft
policy. So the server's model cache keys a loaded model by :func:`load_key` only, and
each answer gets :func:`drafter` for its own setup: the loaded drafters with the
answer's settings where they are the same methods (an n-gram method keeps what it
learned from earlier answers only where its match length is the same), fresh n-gram
drafters where not, nothing for a request that does not draft. A request never makes
the model reload for everyone to change a setting, and its answer is what a model
loaded with its setup would give (speculation never changes an answer; a fresh n-gram
drafter only drafts less at first).
"""
import logging

from geniex.errors import UsageError
from geniex.speculative.drafters import ngram
from geniex.speculative.drafters.base import NO_DRAFTER, DrafterChain, ModelDrafter
from geniex.speculative.options import FALLBACK, METHODS

log = logging.getLogger("geniex.speculative")


def load_key(spec):
    """What a model must have been loaded with to answer ``spec``: its model method and
    draft model (``()`` for a setup without one: any load answers it)."""
    if not spec.model_types:
        return ()
    return ("model", spec.model_types[0], str(spec.draft_path or spec.draft_model))


def parts(drafter):
    """The drafters a loaded drafter is made of (a chain's, or itself)."""
    if drafter is None or drafter is NO_DRAFTER:
        return []
    return list(drafter.drafters) if isinstance(drafter, DrafterChain) else [drafter]


def restore(loaded):
    """Give the loaded drafters back the settings they were built with, where an earlier
    answer set its own (each answer on the loaded setup calls this)."""
    for d in parts(loaded):
        if d.as_loaded is not None:
            _put(d, d.as_loaded)
            d.as_loaded = None


def _settings(d):
    return (d.n_max, d.n_min, d.p_min) if isinstance(d, ModelDrafter) else (d.n_max, d.n_min)


def _put(d, values):
    if isinstance(d, ModelDrafter):
        d.n_max, d.n_min, d.p_min = values
    else:
        d.n_max, d.n_min = values


def _set(d, spec):
    """Give drafter ``d`` an answer's settings from ``spec`` (keeping its own to restore)."""
    if d.as_loaded is None:
        d.as_loaded = _settings(d)
    if isinstance(d, ModelDrafter):
        _put(d, (spec.n_max, spec.n_min, spec.p_min))
    else:
        _, n_min, n_max = spec.ngram_settings(d.name)     # (its match length is its table's)
        _put(d, (n_max, n_min))


def drafter(loaded, spec, rollback=None, kept=None):
    """The drafter of an answer with setup ``spec`` on a model whose drafters are
    ``loaded`` (None: it has none): NO_DRAFTER for a setup that does not draft.
    ``rollback``: how many positions a recurrent target can roll back (None: not
    recurrent); a longer draft is a UsageError naming the field. ``kept``: a dict that
    holds the n-gram drafters made for earlier answers, by method and match length, so
    that what they learned lasts as a loaded one's does. The loaded model was chosen by
    :func:`load_key`, so it has the model drafter ``spec`` asks for."""
    if not spec.types:
        return NO_DRAFTER
    unknown = [t for t in spec.types if t not in METHODS]
    if unknown:
        # As a load with this setup would (geniex.speculative.build): plain, said once.
        log.warning("%s: unknown speculative method %s (known: %s)", FALLBACK, ", ".join(unknown), ", ".join(METHODS))
        return NO_DRAFTER
    if rollback is not None and spec.longest_draft() > rollback:
        field = "spec_n_max" if spec.model_types else "spec_ngram_max"
        raise UsageError(f"{field}: this model has recurrent layers and was loaded for drafts of at most "
                         f"{rollback} tokens; ask for no longer drafts, or load it with a longer setup")
    have = [d for d in parts(loaded) if not isinstance(d, ModelDrafter)]
    made = []
    for name in spec.ngram_types:
        n = spec.ngram_settings(name)[0]
        same = next((d for d in have if d.name == name and d.n == n), None)
        if same is None:
            kept = {} if kept is None else kept
            same = kept.get((name, n)) or kept.setdefault((name, n), ngram.make(name, spec))
        made.append(same)
    if spec.model_types:
        model = next((d for d in parts(loaded) if isinstance(d, ModelDrafter)), None)
        if model is None:
            raise UsageError(f"spec_type: {spec.model_types[0]} needs the model loaded with its draft model")
        if model.most is not None and spec.n_max > model.most:
            raise UsageError(f"spec_n_max: this model's draft was loaded for drafts of at most {model.most} "
                             "tokens; ask for no longer drafts")
        made.append(model)
    for d in made:
        _set(d, spec)
    return made[0] if len(made) == 1 else DrafterChain(made)
