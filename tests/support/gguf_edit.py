"""Copy a GGUF file with metadata keys set and tensors converted, without decoding it.

gguf-py's reader turns every vocabulary string into a numpy object and its writer packs
them back one by one: seconds per copy of the demo model's 49k-entry vocabulary, for
copies that change one key. The header is read by tools/reliability/gguf_mutants.py's
positional parser (the key/value records kept as raw bytes), the keys being set are
encoded again, and the tensor data is copied as it lies, except the tensors ``convert``
changes: a copy costs what writing its bytes costs.

    edit(src, dst, keys={"tokenizer.chat_template": "..."})     # metadata only
    split(src, folder / "m-00001-of-00003.gguf")                   # a split model, as llama-gguf-split writes it
"""
import os
import re
import struct
import sys
from pathlib import Path

from geniex.llama.gguf_file import GGML_TYPES

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "reliability"))
import gguf_mutants  # noqa: E402  (tests may import tools: its GGUF header parser and encoders)

T_UINT16, T_INT32, T_UINT32 = 2, 5, 4
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


def _encoded(kv_type, value):
    if kv_type == gguf_mutants.STRING:
        return gguf_mutants.encode_string(value)
    return gguf_mutants.encode_scalar(kv_type, value)


def _nbytes(dims, ggml_type):
    _, block, size = GGML_TYPES[ggml_type]
    n = 1
    for d in dims:
        n *= d
    return n // block * size


def edit(src, dst, keys=None, convert=None):
    """Write ``dst``: ``src`` with the metadata ``keys`` set (``{name: value}``; a key the
    file has keeps its type, a new one is a string or a uint32). ``convert(name, dims,
    ggml_type)`` may return a function that takes the tensor's bytes and returns ``(new
    type, new bytes)`` (same dims); other tensors are copied as they are. Written under a
    temporary name and renamed; returns ``dst``."""
    src, dst = Path(src), Path(dst)
    source = gguf_mutants.parse(src)
    keys = dict(keys or {})
    kvs = [gguf_mutants.KV(kv.key, kv.vtype, _encoded(kv.vtype, keys.pop(kv.key))) if kv.key in keys else kv
           for kv in source.kvs]
    for key, value in keys.items():          # keys the source does not have
        kv_type = gguf_mutants.STRING if isinstance(value, str) else T_UINT32
        kvs.append(gguf_mutants.KV(key, kv_type, _encoded(kv_type, value)))
    alignment = getattr(source.kv("general.alignment"), "value", None) or 32
    return _write(src, dst, source, kvs, source.tensors, alignment, convert)


def split(src, first):
    """Write ``src`` as the shards of a split model, as ``llama-gguf-split`` writes them:
    ``first`` names the first (``NAME-00001-of-0000N.gguf``; N shards, the others beside
    it), which has all the metadata; every shard has ``split.no``, ``split.count`` and
    ``split.tensors.count`` and a run of the tensors. Returns the shard paths in order."""
    first = Path(first)
    m = re.fullmatch(r"(.+)-00001-of-(\d{5})\.gguf", first.name)
    if not m or int(m.group(2)) < 2:
        raise ValueError(f"{first.name} is not the first of several shards (NAME-00001-of-0000N.gguf)")
    stem, count = m.group(1), int(m.group(2))
    source = gguf_mutants.parse(src)
    if len(source.tensors) < count:
        raise ValueError(f"{src} has {len(source.tensors)} tensors, fewer than {count} shards")
    alignment = getattr(source.kv("general.alignment"), "value", None) or 32
    kept = [kv for kv in source.kvs if kv.key not in SPLIT_KEYS]
    per = -(-len(source.tensors) // count)
    paths = []
    for i in range(count):
        split_kvs = [gguf_mutants.KV(key, vtype, gguf_mutants.encode_scalar(vtype, value)) for key, vtype, value in
                     (("split.no", T_UINT16, i), ("split.count", T_UINT16, count),
                      ("split.tensors.count", T_INT32, len(source.tensors)))]
        extra = [source.kv("general.alignment")] if i and source.kv("general.alignment") else []
        path = first.with_name(f"{stem}-{i + 1:05d}-of-{count:05d}.gguf")
        _write(src, path, source, (kept if i == 0 else extra) + split_kvs,
               source.tensors[i * per:(i + 1) * per], alignment)
        paths.append(path)
    return paths


def _write(src, dst, source, kvs, source_tensors, alignment, convert=None):
    """Write ``dst``: a GGUF of ``kvs`` and the tensors ``source_tensors`` of ``source``
    (read from ``src``, converted where ``convert`` says so). Written under a temporary
    name and renamed; returns ``dst``."""
    dst = Path(dst)
    pad = lambda n: b"\0" * (-n % alignment)      # noqa: E731 (bytes up to the next boundary)
    tensors, pieces, at = [], [], 0           # pieces: (source offset, size, new bytes or None)
    with open(src, "rb") as fin:
        for t in source_tensors:
            ggml_type, size, raw = t.type, _nbytes(t.dims, t.type), None
            change = convert(t.name, t.dims, t.type) if convert is not None else None
            if change is not None:            # converted now: its size is the new type's
                fin.seek(source.data_offset + t.offset)
                ggml_type, raw = change(fin.read(size))
            tensors.append(gguf_mutants.Tensor(t.name, t.dims, ggml_type, at, 0))
            pieces.append((source.data_offset + t.offset, size, raw))
            at += (len(raw) if raw is not None else size)
            at += -at % alignment
    header = b"".join([b"GGUF", struct.pack("<IQQ", source.version, len(tensors), len(kvs)),
                       *map(gguf_mutants.encode_kv, kvs),
                       *(gguf_mutants.encode_string(t.name) + struct.pack(f"<I{len(t.dims)}QIQ", len(t.dims), *t.dims,
                                                                         t.type, t.offset) for t in tensors)])
    tmp = dst.with_name(dst.name + ".part")
    with open(src, "rb") as fin, open(tmp, "wb") as out:
        out.write(header + pad(len(header)))
        for offset, size, raw in pieces:
            if raw is None:
                fin.seek(offset)
                raw = fin.read(size)
            out.write(raw + pad(len(raw)))
    os.replace(tmp, dst)
    return dst
