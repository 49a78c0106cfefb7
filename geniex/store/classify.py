"""What a repo holds: its runtime, its precisions and their files, and its model type.

Works on repo-relative paths (``"sub/model-Q4_0.gguf"``), so the same rules apply to a
Hub listing and to a folder given with ``--local-path``.

- GGUF files make the repo a ``llama_cpp`` model. Among them, ``mmproj`` files are the
  vision/audio projector of a multimodal model, and files with ``mtp`` in their name are
  MTP draft heads. The others are grouped by precision: one file, or one set of
  shards (``-00001-of-00003``), per precision.
- A repo whose only GGUFs are MTP drafts is a draft repo: its groups are drafts
  (pullable, usable as ``--draft-model``, never listed). In a repo that also has a
  target, the MTP file of a precision is stored along with that precision.
- A repo without GGUF files (an AI Hub QAIRT bundle) is ``qairt``: all its files are
  kept, grouped by the precision their names carry (files without one go to every
  group).
"""
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from geniex.store.names import NO_PRECISION, order_precisions, precision_of, shard_of

LLAMA_CPP = "llama_cpp"
QAIRT = "qairt"
LLM = "llm"
VLM = "vlm"
MODEL_TYPES = (LLM, VLM)

# config.json keys that only multimodal models have.
_MULTIMODAL_KEYS = ("vision_config", "audio_config", "vision_tower", "mm_vision_tower", "visual",
                    "image_token_index", "image_token_id", "mm_projector_type", "vision_feature_layer")
# A projector for several precisions: prefer the one of the model's precision, else these.
_MMPROJ_PREFERENCE = ("F16", "BF16", "F32", "Q8_0")
# Repo files a QAIRT bundle does not need.
_SKIP = re.compile(r"(^|/)(\.gitattributes|\.gitignore|README(\.md)?|LICENSE(\.\w+)?)$|\.(png|jpe?g|gif|webp|svg)$", re.IGNORECASE)


@dataclass
class Group:
    """The files of one precision: ``files`` is what gets loaded (shards in order)."""

    precision: str
    files: list
    mmproj: str | None = None
    mtp: list = field(default_factory=list)
    draft: bool = False

    @property
    def all_files(self):
        """Every file this precision needs on disk."""
        return [*self.files, *([self.mmproj] if self.mmproj else []), *self.mtp]


@dataclass
class Layout:
    """How a repo splits into precisions, and which runtime runs it."""

    runtime: str
    groups: dict  # precision -> Group

    @property
    def precisions(self):
        """Precisions in preference order (the first one is the default)."""
        return order_precisions(self.groups)

    @property
    def has_mmproj(self):
        return any(g.mmproj for g in self.groups.values())


def is_gguf(path):
    return str(path).lower().endswith(".gguf")


def is_mmproj(path):
    """``mmproj``, ``mmproj-*``, ``*-mmproj``, ``*_mmproj_*`` (any case, any separator)."""
    stem = re.sub(r"\.gguf$", "", PurePosixPath(path).name.lower())
    return re.search(r"(^|[-_.])mmproj($|[-_.])", stem) is not None


def is_mtp(path):
    """An MTP draft head: ``mtp`` anywhere in the file name."""
    return "mtp" in PurePosixPath(path).name.lower()


def plan(paths, detect=precision_of):
    """Split a repo's file paths into a Layout; ``detect(path)`` gives a file's precision."""
    ggufs = [p for p in paths if is_gguf(p)]
    if not ggufs:
        return Layout(QAIRT, _qairt_groups([p for p in paths if not _SKIP.search(p)], detect))
    projectors = [p for p in ggufs if is_mmproj(p)]
    drafts = [p for p in ggufs if is_mtp(p) and p not in projectors]
    targets = [p for p in ggufs if p not in projectors and p not in drafts]
    if targets:
        groups = _units_by_precision(targets, detect, draft=False)
        for precision, unit in _units_by_precision(drafts, detect, draft=True).items():
            if precision in groups:
                groups[precision].mtp = unit.files
    else:
        groups = _units_by_precision(drafts, detect, draft=True)
    for group in groups.values():
        group.mmproj = _pick_mmproj(projectors, group.precision, detect)
    return Layout(LLAMA_CPP, groups)


def model_type(override=None, config=None, has_mmproj=False):
    """``--model-type`` if given, else ``vlm`` when config.json or an mmproj file says so."""
    if override:
        return override
    if isinstance(config, dict) and any(key in config for key in _MULTIMODAL_KEYS):
        return VLM
    return VLM if has_mmproj else LLM


def _units_by_precision(paths, detect, draft):
    """One Group per precision: a single file or a whole shard set.

    Two unrelated files with one precision (two model sizes in one repo) cannot both
    be that precision; the first in path order wins.
    """
    units = {}
    for path in sorted(paths):
        shard = shard_of(path)
        key = re.sub(r"-\d{5}-of-\d{5}\.gguf$", "", path, flags=re.IGNORECASE) if shard else path
        units.setdefault(key, []).append(path)
    groups = {}
    for files in units.values():
        precision = detect(files[0]) or NO_PRECISION
        groups.setdefault(precision, Group(precision, files, draft=draft))
    return groups


def _pick_mmproj(projectors, precision, detect):
    if not projectors:
        return None
    by_precision = {detect(p): p for p in sorted(projectors, reverse=True)}
    for wanted in (precision, *_MMPROJ_PREFERENCE):
        if wanted in by_precision:
            return by_precision[wanted]
    return sorted(projectors)[0]


def _qairt_groups(paths, detect):
    tagged = {p: detect(p) for p in paths}
    precisions = sorted({t for t in tagged.values() if t}) or [NO_PRECISION]
    return {
        precision: Group(precision, [p for p, t in sorted(tagged.items()) if t in (precision, None)])
        for precision in precisions
    }
