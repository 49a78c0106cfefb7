"""The speculative settings, owned in one place.

:data:`FIELDS` is the one table of every setting: its name in :class:`SpecOptions`,
its ``infer``/``run`` flag, its request field, type, default, bounds, which methods use
it and what it means. The CLI flags (:func:`add_flags`), the request schema's
``spec_*`` properties (:func:`schema_properties`, checked against
``schemas/chat_completions.request.json`` by a test), ``geniex run``'s request fields
(:func:`to_request`), the Python API's keyword arguments and the server's model-cache
key (:meth:`SpecOptions.key`) are all built from it.

Adding a setting: a row here, its use in the drafter, a test (docs/development.md).
"""
import argparse
from dataclasses import dataclass, field

from geniex.errors import UsageError

# Methods, in the order ``--spec-type`` lists them. Model methods need a draft (or the
# target's own NextN layers); n-gram methods look for repeats in the token history.
MODEL_METHODS = ("draft-mtp", "draft-simple", "draft-eagle3")
NGRAM_METHODS = ("ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache")
METHODS = MODEL_METHODS + NGRAM_METHODS
# Every speculative setup failure is this warning, and the answer is decoded plainly.
FALLBACK = "speculative decoding setup failed; falling back to plain decoding"

# Per n-gram method: (match length, shortest draft, longest draft) when the request
# leaves them at 0. Chosen by measurement on the demo model (tools/bench/counts.py);
# ngram-mod's draft policy sizes each draft within the longest by its tokens'
# probabilities, so its cap is higher.
NGRAM_DEFAULTS = {
    "ngram-mod": (4, 2, 16),
    "ngram-simple": (4, 2, 8),
    "ngram-map-k": (3, 2, 8),
    "ngram-map-k4v": (4, 2, 8),
    "ngram-cache": (3, 2, 8),
}

# The most draft tokens one step may verify. The target context's batch holds 512
# rows; the loop also cuts every draft to what the batch holds, whatever a drafter asks.
MAX_DRAFT = 256
MAX_NGRAM_N = 64


@dataclass(frozen=True)
class Field:
    """One speculative setting as every surface spells it."""

    attr: str              # SpecOptions attribute
    flag: str              # infer/run flag
    request: str           # request body field
    kind: type             # int, float, str, or tuple (a --spec-type list)
    default: object
    used_by: str           # "all", "model" or "ngram": which methods read it
    help: str
    minimum: float = None
    maximum: float = None
    choices: tuple = ()

    @property
    def dest(self):
        """The argparse attribute name (and the Python API keyword)."""
        return self.flag.lstrip("-").replace("-", "_")

    def check(self, value, where):
        """``value`` converted to this field's type and within bounds, else UsageError
        naming the setting as ``where`` spells it (a flag or a request field)."""
        if self.kind is tuple:
            return parse_types(value)
        if self.kind is str:
            text = "" if value is None else str(value).strip()
            if self.choices and text.lower() not in self.choices:
                raise UsageError(f"{where} must be one of {', '.join(self.choices)} (got {value!r})")
            return text.lower() if self.choices else text
        try:
            if self.kind is int and isinstance(value, float) and not value.is_integer():
                raise ValueError
            number = self.kind(value)
        except (TypeError, ValueError):
            what = "a whole number" if self.kind is int else "a number"
            raise UsageError(f"{where} takes {what}, not {value!r}") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise UsageError(f"{where} must be a finite number (got {value!r})")
        if self.minimum is not None and number < self.minimum:
            raise UsageError(f"{where} must be at least {self.minimum} (got {value})")
        if self.maximum is not None and number > self.maximum:
            raise UsageError(f"{where} must be at most {self.maximum} (got {value})")
        return number


FIELDS = (
    Field("types", "--spec-type", "spec_type", tuple, (), "all",
          "speculative decoding: a comma list of " + ", ".join(METHODS) + " (default off)"),
    Field("draft_model", "--draft-model", "spec_draft_model", str, "", "model",
          "draft model: a stored name org/repo[:precision], or a GGUF path (a server accepts paths "
          "only when started with --allow-paths)"),
    Field("n_max", "--draft-tokens", "spec_n_max", int, 3, "model",
          "most tokens a draft model proposes per step", 1, MAX_DRAFT),
    Field("n_min", "--draft-min", "spec_n_min", int, 0, "model",
          "a draft model's drafts shorter than this are dropped", 0, MAX_DRAFT),
    Field("p_min", "--draft-p-min", "spec_p_min", float, 0.0, "model",
          "a draft model stops proposing below this probability", 0, 1),
    Field("ngram_n", "--ngram-n", "spec_ngram_n", int, 0, "ngram",
          "n-gram match length (0 = the method's default)", 0, MAX_NGRAM_N),
    Field("ngram_min", "--ngram-min", "spec_ngram_min", int, 0, "ngram",
          "shortest n-gram draft (0 = the method's default, 2)", 0, MAX_DRAFT),
    Field("ngram_max", "--ngram-max", "spec_ngram_max", int, 0, "ngram",
          "longest n-gram draft (0 = the method's default, 8)", 0, MAX_DRAFT),
    Field("policy", "--draft-policy", "spec_draft_policy", str, "auto", "all",
          "draft length per step: auto (the length with the most expected tokens per unit of "
          "time, measured) or fixed (as long as the drafter offers, up to its maximum)",
          choices=("auto", "fixed")),
)


def parse_types(value):
    """A ``--spec-type`` comma list (or a list) -> tuple of lower-case names. Unknown
    names are kept: building the drafters refuses them with a reason and falls back
    to plain decoding, as GenieX does."""
    if not value:
        return ()
    parts = value.split(",") if isinstance(value, str) else value
    return tuple(t.strip().lower() for t in parts if t and t.strip())


@dataclass
class SpecOptions:
    """Speculative decoding settings of one loaded model (see :data:`FIELDS`)."""

    types: tuple = ()
    draft_model: str = ""            # as the user wrote it (for messages)
    n_max: int = 3
    n_min: int = 0
    p_min: float = 0.0
    ngram_n: int = 0
    ngram_min: int = 0
    ngram_max: int = 0
    policy: str = "auto"
    draft_path: object = field(default=None)   # the draft model's resolved GGUF path

    @property
    def enabled(self):
        return bool(self.types)

    @property
    def model_types(self):
        return tuple(t for t in self.types if t in MODEL_METHODS)

    @property
    def ngram_types(self):
        return tuple(t for t in self.types if t in NGRAM_METHODS)

    def ngram_settings(self, method):
        """``(n, min, max)`` of an n-gram method, the method's defaults filling zeros."""
        n, lo, hi = NGRAM_DEFAULTS[method]
        return self.ngram_n or n, self.ngram_min or lo, self.ngram_max or hi

    def longest_draft(self):
        """The most tokens any requested method may draft in one step (what a recurrent
        target must be able to roll back)."""
        caps = [self.n_max for _ in self.model_types]
        caps += [self.ngram_settings(t)[2] for t in self.ngram_types]
        return max(caps, default=0)

    def key(self):
        """What identifies this setup in the server's model cache: the methods and only
        the settings those methods read (an n-gram method ignores ``spec_n_max``)."""
        used = {"all"} | ({"model"} if self.model_types else set()) | ({"ngram"} if self.ngram_types else set())
        values = []
        for f in FIELDS:
            if f.used_by in used:
                value = getattr(self, f.attr)
                if f.attr == "draft_model":
                    value = str(self.draft_path or value)
                values.append((f.attr, value))
        return tuple(values) if self.types else ()


def from_values(get, name_of, draft_path=None):
    """SpecOptions from any source: ``get(name)`` returns a value or None, and
    ``name_of(field)`` is how that source names a field (for lookups and messages)."""
    values = {}
    for f in FIELDS:
        raw = get(name_of(f))
        try:
            values[f.attr] = f.default if raw is None else f.check(raw, name_of(f))
        except UsageError as e:
            e.param = name_of(f)       # the server's error names the field
            raise
    return SpecOptions(**values, draft_path=draft_path)


def from_args(args, draft_path=None):
    """SpecOptions from parsed ``infer``/``run`` flags."""
    return from_values(lambda n: getattr(args, n, None), lambda f: f.dest, draft_path)


def from_request(body, draft_path=None):
    """SpecOptions from a request body's ``spec_*`` fields (already schema-checked)."""
    return from_values(body.get, lambda f: f.request, draft_path)


def from_kwargs(kwargs, draft_path=None):
    """SpecOptions from Python API keywords (``spec_type=``, ``draft_tokens=``, ...)."""
    known = {f.dest for f in FIELDS}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise UsageError(f"unknown speculative setting {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return from_values(kwargs.get, lambda f: f.dest, draft_path)


def to_request(spec):
    """The request fields that carry ``spec`` to a server (what ``geniex run`` sends)."""
    if not spec.types:
        return {}
    out = {}
    for f in FIELDS:
        value = getattr(spec, f.attr)
        out[f.request] = ",".join(value) if f.kind is tuple else value
    return out


# -- CLI ------------------------------------------------------------------------------
def _flag_type(f):
    def parse(value):
        try:
            return f.check(value, f.flag)
        except UsageError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def add_flags(group):
    """Add every speculative flag to an argparse group (``infer`` and ``run``)."""
    for f in FIELDS:
        default = "" if f.kind is tuple else f.default
        kind = None if f.kind is tuple or (f.kind is str and not f.choices) else _flag_type(f)
        shown = f.kind not in (tuple, str) or f.choices
        extra = f" (default {f.default})" if shown and not f.attr.startswith("ngram") else ""
        group.add_argument(f.flag, type=kind, default=default, help=f.help + extra)


# -- request schema ---------------------------------------------------------------------
_JSON_TYPES = {int: "integer", float: "number", str: "string", tuple: "string"}


def schema_properties():
    """The ``spec_*`` properties of the chat request schema, as this table defines them."""
    props = {}
    for f in FIELDS:
        prop = {"type": [_JSON_TYPES[f.kind], "null"]}
        if f.minimum is not None:
            prop["minimum"] = f.minimum
        if f.maximum is not None:
            prop["maximum"] = f.maximum
        if f.kind in (int, float):
            prop["default"] = f.default
        elif f.choices:
            prop["enum"] = list(f.choices) + [None]
            prop["default"] = f.default
            del prop["type"]
        elif f.kind is str:
            prop["maxLength"] = 4096
        else:
            prop["maxLength"] = 256
        used = {"all": "", "model": " Read by draft-mtp, draft-simple and draft-eagle3.",
                "ngram": " Read by the ngram-* methods."}[f.used_by]
        key = " Part of the model cache key when a method reads it."
        prop["description"] = f"{f.help[0].upper()}{f.help[1:]} (`{f.flag}`).{used}{key}"
        props[f.request] = prop
    return props


def schema_unknown_pattern():
    """The ``patternProperties`` entry that refuses unknown ``spec_*`` fields by name."""
    names = "|".join(f.request[len("spec_"):] for f in FIELDS)
    listed = ", ".join(f.request for f in FIELDS)
    return {f"^spec_(?!({names})$)": {
        "not": {}, "x-error": f"unknown speculative field; the spec_* fields are {listed}"}}
