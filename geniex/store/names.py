"""Model names (``org/repo[:precision]``) and what GGUF file names say about precision.

A *precision* is the quantisation a GGUF was made with (``Q4_0``, ``Q4_K_M``, ``F16``,
...). Hub repos encode it in the file name, in many spellings: ``model-Q4_K_M.gguf``,
``model.Q4_1.gguf``, ``model_q8_0.gguf``, ``Q4_K_M/model-00001-of-00002.gguf``. We
store and print it upper-case and accept any case on input.
"""
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from geniex.errors import UsageError

# Tried in this order when no precision is given (then the rest, alphabetically):
# Q4_0 has the best NPU support, Q4_K_M is the usual CPU/GPU choice, Q8_0 the safe one.
PREFERRED_PRECISIONS = ("Q4_0", "Q4_K_M", "Q8_0")

# The precision of a file whose name carries none (and whose header we could not read).
NO_PRECISION = "DEFAULT"

# Hub ids: letters, digits, '.', '_' and '-', starting with a letter or digit.
_ID_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
PRECISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")   # how a precision may be spelled

# A quant tag inside a file name. The tag's parts are joined by '_', which is also a
# common separator, so the parts after the first are limited to the shapes llama.cpp
# quant names take (Q4_K_M, IQ2_XXS, Q4_0_4_4, ...). Optional Unsloth "UD-" prefix.
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])("
    r"(?:UD-)?(?:I?Q[1-8](?:_(?:[0-9]|K|S|M|L|XS|XXS|NL|XL))*"
    r"|TQ[12]_0|MXFP4(?:_MOE)?|BF16|F16|FP16|F32|FP32)"
    r"|W[0-9]+A[0-9]+"  # AI Hub (QAIRT) precisions: w4a16, w8a16
    r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_ALIASES = {"FP16": "F16", "FP32": "F32"}


@dataclass(frozen=True)
class ModelName:
    """A parsed ``org/repo[:precision]``; ``precision`` is upper-case or None."""

    org: str
    repo: str
    precision: str | None = None

    @property
    def repo_id(self):
        """``org/repo``, the Hub's id for the repository."""
        return f"{self.org}/{self.repo}"

    def with_precision(self, precision):
        """The same model at another precision."""
        return ModelName(self.org, self.repo, normalize_precision(precision) if precision else None)

    def __str__(self):
        return f"{self.repo_id}:{self.precision}" if self.precision else self.repo_id


def normalize_precision(text):
    """Canonical spelling of a precision given in any case (``q4_k_m`` -> ``Q4_K_M``)."""
    value = text.strip().upper()
    return _ALIASES.get(value, value)


def parse_name(text):
    """Parse ``org/repo[:precision]``; raises UsageError with the expected shape."""
    raw = str(text).strip()
    base, sep, precision = raw.partition(":")
    parts = base.split("/")
    hint = f"model names look like org/repo[:precision], e.g. unsloth/Qwen3-0.6B-GGUF:Q4_K_M (got {raw!r})"
    if len(parts) != 2 or not all(_ID_PART.match(p) for p in parts) or ".." in base:
        raise UsageError(hint)
    if sep and not PRECISION.match(precision):
        raise UsageError(f"bad precision {precision!r}: " + hint)
    return ModelName(parts[0], parts[1], normalize_precision(precision) if sep else None)


def shard_of(filename):
    """``(index, count)`` for a sharded GGUF (``x-00001-of-00003.gguf``), else None."""
    m = _SHARD.search(PurePosixPath(filename).name)
    return (int(m.group(1)), int(m.group(2))) if m else None


def precision_of(path):
    """The precision named in a repo file's path, or None.

    The file name wins over its folders; within a name the last tag wins, because
    model names can contain quant-like words before the real tag.
    """
    p = PurePosixPath(path)
    stem = _SHARD.sub("", p.name)
    stem = re.sub(r"\.gguf$", "", stem, flags=re.IGNORECASE)
    for candidate in [stem, *reversed(p.parent.parts)]:
        found = _QUANT.findall(candidate)
        if found:
            return normalize_precision(found[-1])
    return None


def order_precisions(precisions):
    """Precisions in preference order: PREFERRED_PRECISIONS first, then alphabetical."""
    rank = {p: i for i, p in enumerate(PREFERRED_PRECISIONS)}
    return sorted(set(precisions), key=lambda p: (rank.get(p, len(rank)), p))
