"""Rewrite the ``spec_*`` properties of ``schemas/chat_completions.request.json`` from
the options table (``geniex.speculative.options.FIELDS``), the one place they are
defined. ``tests/speculative/test_options.py`` fails while the file and the table differ.

The file keeps its layout (one property a line); only the ``spec_*`` lines and the
``patternProperties`` block are replaced.

    python tools/release/sync_schemas.py
"""
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from geniex.speculative import options  # noqa: E402

SCHEMA = ROOT / "schemas" / "chat_completions.request.json"


def synced_text(text):
    """The schema text with its spec_* property lines and unknown-field pattern rebuilt."""
    lines = text.splitlines()
    spec = [i for i, line in enumerate(lines) if line.startswith('    "spec_')]
    if not spec:
        raise SystemExit("no spec_* property lines found in the schema")
    first, last = spec[0], spec[-1]
    closing = lines[last].rstrip().endswith(",")
    props = options.schema_properties()
    new = [f'    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},' for k, v in props.items()]
    if not closing:
        new[-1] = new[-1].rstrip(",")
    lines[first:last + 1] = new
    text = "\n".join(lines) + "\n"
    pattern = json.dumps(options.schema_unknown_pattern(), ensure_ascii=False, indent=2)
    pattern = pattern.replace("\n", "\n  ")
    return re.sub(r'"patternProperties": \{.*?\n  \},', '"patternProperties": ' + pattern + ",",
                  text, count=1, flags=re.S)


def main():
    SCHEMA.write_text(synced_text(SCHEMA.read_text(encoding="utf-8")), encoding="utf-8")
    json.loads(SCHEMA.read_text(encoding="utf-8"))
    print(f"wrote {SCHEMA.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
