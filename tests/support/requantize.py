"""Write a copy of a GGUF model with its 4/5-bit weights requantized (default: to Q4_0).

The prebuilt llama.cpp library does not export ``llama_model_quantize``, so this goes
through gguf-py's quants: every Q4_0/Q4_1/Q5_0/Q5_1 tensor is dequantized to float32 and
quantized to the target type with ``gguf.quants``; everything else (F32 norms, the Q8_0
embedding) is copied byte for byte, and ``general.file_type`` is set to the new type
(the file is written by tests/support/gguf_edit.py, which copies the vocabulary's bytes
as they are: gguf-py's reader and writer took most of a copy's time).
The demo model (SmolLM2-135M Q4_1) becomes a Q4_0 model, the format of QAT releases
such as Gemma-4's, so tests can check exactness on Q4_0 weights (which this CPU repacks).

    python tests/support/requantize.py SRC.gguf DST.gguf [--type q4_0]
    python tests/support/requantize.py --demo DST.gguf          # the bundled demo model

Requantizing from an already quantized file loses a little more than quantizing from
the original weights; for a test fixture that is irrelevant (it is a valid Q4_0 model).
"""
import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import Keys
from gguf.constants import GGMLQuantizationType as Q
from gguf.constants import LlamaFileType as F
from gguf.quants import dequantize, quantize

import gguf_edit
from geniex.llama.gguf_file import GGML_TYPES

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

    def convert(name, dims, ggml_type):
        if ggml_type not in SOURCE_TYPES or ggml_type == target:
            return None
        _, block, size = GGML_TYPES[ggml_type]

        def change(raw):
            rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, dims[0] // block * size)
            return int(target), quantize(dequantize(rows, Q(ggml_type)), target).tobytes()
        return change

    return gguf_edit.edit(src, dst, {Keys.General.FILE_TYPE: int(file_type)}, convert=convert)


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
