"""ResolvedModel: what a model name or path comes down to on disk."""
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from geniex.errors import ModelLoadError, ModelNotFound
from geniex.llama.gguf_file import open_regular
from geniex.store.classify import LLAMA_CPP, LLM, is_mtp
from geniex.store.names import precision_of, shard_of

GGUF_MAGIC = b"GGUF"


@dataclass
class ResolvedModel:
    """A model ready to load.

    ``name`` is canonical (``org/repo:PRECISION``), or the absolute path for a path.
    ``path`` is the GGUF to load (the first shard of a sharded model; for a ``qairt``
    bundle, its folder). ``files`` are all files this precision uses, ``mmproj`` the
    projector of a multimodal model, ``is_draft`` true for MTP draft files.
    ``location`` is where the model lives (its store folder).
    """

    name: str
    path: Path
    precision: str | None
    runtime: str
    type: str
    mmproj: Path | None = None
    is_draft: bool = False
    files: list = field(default_factory=list)
    location: Path | None = None
    already_present: bool = False      # set by Store.pull when nothing had to be fetched

    @property
    def size(self):
        """Bytes on disk of all ``files``."""
        return sum(f.stat().st_size for f in self.files if f.exists())


def from_gguf_path(path):
    """A ResolvedModel for a GGUF file given by path (absolute, or relative to the cwd).

    Given any shard of a sharded model, loads from the first one (llama.cpp finds the
    others by name).
    """
    path = Path(os.path.abspath(Path(path).expanduser()))
    if not path.exists():
        raise ModelNotFound(f"no such file: {path}")
    if path.is_dir():
        raise ModelNotFound(f"{path} is a folder; give the .gguf file to load, or register the folder with `geniex pull ORG/REPO --local-path {path}`")
    # A FIFO or device would block the read below: refused before it is opened.
    with open_regular(path) as f:
        try:
            magic = f.read(4)
        except OSError as e:
            raise ModelLoadError(f"cannot read {path}: {e.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file")
    files = [path]
    shard = shard_of(path.name)
    if shard:
        stem = re.sub(r"-\d{5}-of-\d{5}\.gguf$", "", path.name, flags=re.IGNORECASE)
        files = [path.with_name(f"{stem}-{i:05d}-of-{shard[1]:05d}.gguf") for i in range(1, shard[1] + 1)]
        missing = [f for f in files if not f.exists()]
        if missing:
            raise ModelNotFound(f"shard {missing[0].name} of {path.name} is missing next to it")
    return ResolvedModel(name=str(path), path=files[0], precision=precision_of(path.name), runtime=LLAMA_CPP,
                         type=LLM, is_draft=is_mtp(path.name), files=files, location=path.parent)
