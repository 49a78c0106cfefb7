"""Copies of the demo model with metadata written in, for the server routes that need
what SmolLM2's GGUF does not declare (``gguf_edit.edit`` in tests/support/gguf_edit.py):

- ``{arch}.pooling_type`` = mean: the model declares a pooling, so ``/embeddings`` and
  ``/v1/embeddings`` answer (the plain demo model is refused there);
- ``tokenizer.ggml.fim_pre/suf/mid_token_id``: fill-in-the-middle tokens, so
  ``/infill`` answers (the plain demo model has none and is refused). SmolLM2's
  vocabulary has no ``<fim_prefix>`` tokens, so three of its unused special tokens
  stand in for them (``<repo_name>``, ``<file_sep>``, ``<filename>``): what is tested
  is that the route builds the prompt from the tokens the GGUF declares.

    python tests/support/demo_variants.py OUT.gguf
"""
import sys
from pathlib import Path

from gguf_edit import edit

POOLING_MEAN = 1                       # llama_pooling_type
FIM = {"pre": 3, "suf": 5, "mid": 6}   # token ids declared as the FIM tokens


def demo_with_pooling_and_fim(src, dst):
    """Write the variant of the demo GGUF ``src`` to ``dst`` (reused if newer); returns ``dst``."""
    src, dst = Path(src), Path(dst)
    if dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    keys = {"llama.pooling_type": POOLING_MEAN}
    keys.update({f"tokenizer.ggml.fim_{name}_token_id": tok for name, tok in FIM.items()})
    return edit(src, dst, keys)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from geniex.store import demo_model_path
    print(demo_with_pooling_and_fim(demo_model_path(), sys.argv[1]))
