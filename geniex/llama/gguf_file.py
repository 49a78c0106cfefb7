"""Read a GGUF file's header (metadata and tensor table) and check it is whole.

llama.cpp aborts the process on some malformed inputs, and a mismatched MTP pair can
only be caught from metadata, so every file is read here before the library sees it.
This is a small reader of our own, not ``gguf.GGUFReader``, because that one decodes
every vocabulary string into numpy objects (seconds for a 49k vocab) where we need
milliseconds: large arrays are skipped, and only their length is kept.
"""
import os
import stat
import struct
from dataclasses import dataclass, field
from pathlib import Path

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from geniex.errors import ModelLoadError

MAGIC = b"GGUF"
_SCALARS = {  # gguf value type -> struct format
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}
T_STRING, T_ARRAY = 8, 9
KEEP_ARRAY = 256   # arrays longer than this are kept as their length only


@dataclass
class TensorInfo:
    """One entry of the tensor table."""

    name: str
    shape: tuple      # ggml order: ne0 first
    type: int
    offset: int       # relative to the data section
    nbytes: int


@dataclass
class GGUFHeader:
    """What a GGUF file says about itself."""

    path: Path
    version: int
    metadata: dict
    tensors: dict = field(default_factory=dict)
    data_offset: int = 0

    @property
    def architecture(self):
        return self.metadata.get("general.architecture", "")

    def arch_key(self, suffix, default=None):
        """``{architecture}.{suffix}``, e.g. ``arch_key('embedding_length')``."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)


class _Cursor:
    def __init__(self, f, path):
        self.f, self.path = f, path

    def read(self, n):
        data = self.f.read(n)
        if len(data) != n:
            raise ModelLoadError(f"{self.path}: truncated GGUF header (the file ends early); "
                                 "re-download it")
        return data

    def unpack(self, fmt):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.unpack("<Q")
        if n > 1 << 24:
            raise ModelLoadError(f"{self.path}: corrupt GGUF header (string of {n} bytes)")
        return self.read(n).decode("utf-8", "replace")

    def value(self, vtype):
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == T_STRING:
            return self.string()
        if vtype == T_ARRAY:
            etype, n = self.unpack("<I"), self.unpack("<Q")
            if n <= KEEP_ARRAY:
                return [self.value(etype) for _ in range(n)]
            if etype in _SCALARS:
                self.f.seek(n * struct.calcsize(_SCALARS[etype]), 1)
            else:
                for _ in range(n):
                    self.value(etype)
            return ArrayLength(n)
        raise ModelLoadError(f"{self.path}: corrupt GGUF header (unknown value type {vtype})")


def open_regular(path):
    """``path`` opened for binary reading, only if it is a regular file.

    A FIFO blocks ``open()`` until a writer comes and a device may never end, so both
    are refused before opening; the file is opened non-blocking and checked again on
    the open descriptor, so one swapped in meanwhile cannot block us either.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise ModelLoadError(f"no such model file: {path}") from None
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise ModelLoadError(f"{path} is a folder, not a model file")
    if not stat.S_ISREG(mode):
        raise ModelLoadError(f"{path} is not a regular file (a pipe, socket or device); refusing to read it")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ModelLoadError(f"{path} is not a regular file (a pipe, socket or device); refusing to read it")
    return os.fdopen(fd, "rb")


class ArrayLength(int):
    """Stands for a long metadata array (e.g. the vocabulary) by its length."""


def read_header(path):
    """Parse ``path``'s GGUF header and check that every tensor lies inside the file.

    Raises ModelLoadError with one clear line for a missing file, a non-GGUF file or a
    truncated one.
    """
    path = Path(path)
    f = open_regular(path)
    size = os.fstat(f.fileno()).st_size
    try:
        with f:
            cur = _Cursor(f, path)
            if f.read(4) != MAGIC:
                raise ModelLoadError(f"{path} is not a GGUF model file (bad magic bytes)")
            version = cur.unpack("<I")
            if version not in (2, 3):
                raise ModelLoadError(f"{path}: unsupported GGUF version {version}")
            n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
            if n_tensors > 1 << 20 or n_kv > 1 << 20:
                raise ModelLoadError(f"{path}: corrupt GGUF header")
            meta = {}
            for _ in range(n_kv):
                key = cur.string()
                meta[key] = cur.value(cur.unpack("<I"))
            tensors = {}
            for _ in range(n_tensors):
                name = cur.string()
                n_dims = cur.unpack("<I")
                if n_dims > 8:
                    raise ModelLoadError(f"{path}: corrupt GGUF tensor table")
                shape = tuple(cur.unpack("<Q") for _ in range(n_dims))
                ttype, offset = cur.unpack("<I"), cur.unpack("<Q")
                tensors[name] = TensorInfo(name, shape, ttype, offset, _nbytes(path, shape, ttype))
            align = int(meta.get("general.alignment", 32))
            pos = f.tell()
            data_offset = (pos + align - 1) // align * align
    except OSError as e:
        raise ModelLoadError(f"cannot read {path}: {e.strerror or e}") from None
    end = max((data_offset + t.offset + t.nbytes for t in tensors.values()), default=data_offset)
    # A split GGUF's first shard holds metadata only for its own tensors; the check holds per shard.
    if end > size:
        raise ModelLoadError(f"{path} is truncated: its tensors need {end} bytes but the file has "
                             f"{size}; re-download it")
    return GGUFHeader(path, version, meta, tensors, data_offset)


def _nbytes(path, shape, ttype):
    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):
        raise ModelLoadError(f"{path}: unknown tensor type {ttype} (a newer GGUF than this library?)") from None
    n = 1
    for d in shape:
        n *= d
    return n // block * type_size
