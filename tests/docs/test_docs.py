"""The documentation tells the truth about the tree: every path it names exists, every
link and anchor resolves, every ``geniex VERB`` and its flags exist, every
``python tools/...`` command and its flags exist, every ``pip install '.[extra]'`` names
an extra of setup.cfg, the API reference is the one generated from the schemas, and
the README stays a short page. Docstrings and comments of the code name only paths and
pages that exist."""
import re

import pytest

from geniex.cli import build_parser
from shared_fixtures import ROOT, load_tool

pytestmark = pytest.mark.fast

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Paths in the tree as the docs write them: `geniex/engine/loop.py`, tests/support/, ...
PATH = re.compile(r"(?<![\w./~-])((?:geniex|tests|tools|schemas|docs|lib|\.ci)/[\w./*-]*[\w*/])")
# A page or a tool named in code without its folder: ``BENCHMARKS.md``, ``bench.py``.
PAGE = re.compile(r"(?<![\w./~-])([\w-]+\.md)\b")
# ``python tools/<room>/<tool>.py --flag ...`` in the docs.
TOOL = re.compile(r"python3? (tools/[\w/.-]+\.py)([^\n`|#]*)")
SOURCES = sorted(p for folder in ("geniex", "tools", "tests") for p in (ROOT / folder).rglob("*.py"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A `geniex VERB ...` command in code: an inline code span or a line of a code block.
COMMAND = re.compile(r"(?:^|\$ |&& |; )\s*(?:python -m )?geniex ([a-z]+)([^#|\n]*)")


def _docs():
    return [(p, p.read_text(encoding="utf-8")) for p in DOCS]


def _code(text):
    """Inline code spans and code-block lines of a markdown text."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    lines = [line for block in blocks for line in block.splitlines()]
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return lines + re.findall(r"`([^`\n]+)`", prose)


def _slug(title):
    # GitHub's anchor for a heading: lower case, punctuation dropped, spaces -> '-'.
    text = re.sub(r"[`*_]", "", title.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(text):
    in_code = False
    anchors = set()
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def _missing_paths(text):
    missing = []
    for path in PATH.findall(text):
        path = path.split("::")[0].rstrip(".")
        if "*" in path:
            found = list(ROOT.glob(path))
        else:
            found = (ROOT / path).exists()
        if not found:
            missing.append(path)
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_path_the_docs_name_exists(doc):
    missing = _missing_paths(doc.read_text(encoding="utf-8"))
    assert not missing, f"{doc.name} names paths that do not exist: {sorted(set(missing))}"


def test_every_path_and_page_the_code_names_exists():
    """Docstrings and comments cite files of this tree (``tests/support/requantize.py``,
    ``docs/speculative.md``): each must exist, and a page named alone (``BENCHMARKS.md``)
    must exist somewhere in the tree."""
    pages = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts}
    bad = []
    for source in SOURCES:
        text = source.read_text(encoding="utf-8")
        rel = source.relative_to(ROOT)
        bad += [f"{rel}: {path}" for path in _missing_paths(text)]
        bad += [f"{rel}: {page}" for page in PAGE.findall(text) if page not in pages]
    assert not bad, "the code cites files that are not in the tree:\n" + "\n".join(bad)


def test_every_tool_command_and_flag_the_docs_name_exists():
    bad = []
    for doc, text in _docs():
        for tool, rest in TOOL.findall(text):
            path = ROOT / tool
            if not path.is_file():
                bad.append(f"{doc.name}: {tool}")
                continue
            # A tool's flags are declared in it or in a module of its room it imports.
            source = "".join(p.read_text(encoding="utf-8") for p in path.parent.glob("*.py"))
            bad += [f"{doc.name}: {tool} {flag}" for flag in re.findall(r"(?<![\w-])(--[a-zA-Z][\w-]*)", rest)
                    if f'"{flag}"' not in source]
    assert not bad, "the docs name tools or flags that do not exist:\n" + "\n".join(bad)


def test_every_extra_the_docs_install_exists():
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    named = {(doc.name, extra) for doc, text in _docs() for group in re.findall(r"\.\[([\w,-]+)\]", text)
             for extra in group.split(",")}
    assert named, "the README names the test extra"
    bad = sorted(f"{doc}: .[{extra}]" for doc, extra in named if extra not in extras)
    assert not bad, f"the docs install extras setup.cfg does not define: {bad}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_and_anchor_resolves(doc):
    text = doc.read_text(encoding="utf-8")
    broken = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text(encoding="utf-8")):
            broken.append(target)
    assert not broken, f"{doc.name} has broken links: {broken}"


def _flags(parser):
    return {s for action in parser._actions for s in action.option_strings}


def test_every_command_and_flag_the_docs_name_exists():
    parser = build_parser()
    verbs = next(a for a in parser._actions if a.dest == "verb").choices
    global_flags = _flags(parser)
    bad = []
    for doc, text in _docs():
        for verb, rest in (m for code in _code(text) for m in COMMAND.findall(code)):
            if verb not in verbs:
                bad.append(f"{doc.name}: geniex {verb}")
                continue
            known = _flags(verbs[verb]) | global_flags
            for flag in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", rest):
                if flag not in known:
                    bad.append(f"{doc.name}: geniex {verb} {flag}")
    assert not bad, "the docs name commands or flags that do not exist:\n" + "\n".join(bad)


def test_the_api_reference_is_generated_from_the_schemas():
    api_docs = load_tool("release/api_docs.py")
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == api_docs.render(), \
        "docs/api.md is out of date: run python tools/release/api_docs.py"


def test_the_readme_is_a_short_page_that_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    blocks = re.findall(r"```bash\n(.*?)\n```", text, re.S)
    assert blocks[0].endswith('python -m geniex infer -p "Why is the sky blue?"')
    assert blocks[1].endswith("python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert blocks[1] in ci, ".ci/run must run the README's test command verbatim"
