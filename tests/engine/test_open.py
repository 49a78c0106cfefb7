"""One way to open a model: ``open_session`` checks the context before the library
allocates, and every caller (``infer``, the server's worker, ``geniex.api.load``) goes
through it with LoadOptions built by ``load_options``."""
import pytest

import geniex.api as gx
from geniex.engine import limits
from geniex.engine.session import LoadOptions, load_options
from geniex.errors import UsageError


@pytest.mark.fast
def test_load_options_takes_each_field_from_the_last_layer_that_sets_it():
    defaults = {"nctx": 4096, "ngl": -1, "compute": None, "cache_type_k": "q8_0", "n_predict": 7}
    body = {"nctx": 512, "compute": None, "cache_type_k": "F16", "messages": []}
    options = load_options(defaults, body, data_dir="/d", memory_budget=1 << 20)
    assert (options.nctx, options.ngl, options.compute, options.cache_type_k) == (512, -1, None, "f16")
    # Unset fields keep LoadOptions' own defaults; what is not a load field is ignored.
    assert (options.cache_type_v, options.threads) == (LoadOptions.cache_type_v, 0)
    assert (options.data_dir, options.memory_budget, options.spec.enabled) == ("/d", 1 << 20, False)


@pytest.mark.fast
def test_the_python_api_refuses_a_context_over_the_memory_budget_before_loading(demo_model, monkeypatch):
    """geniex.api.load skipped the context checks before it opened through open_session."""
    monkeypatch.setenv(limits.BUDGET_ENV, "16M")
    with pytest.raises(UsageError, match="memory budget of 16 MiB"):
        gx.load(str(demo_model), nctx=8192)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """Any model does for how a model is opened: a tiny generated one (trained context 512,
    tests/support/tiny_gemma4.py), whose loads cost a fraction of the demo model's."""
    import tiny_gemma4
    return tiny_gemma4.write_target(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def test_the_python_api_cuts_a_default_context_to_what_the_model_was_trained_for(tiny_model):
    trained = limits.trained_context(limits.header_of(tiny_model))
    assert trained == 512
    session = gx.load(str(tiny_model), nctx=trained * 4)
    try:
        assert session.ctx.n_ctx == trained
    finally:
        session.close()


def test_a_load_parses_the_models_header_once(tiny_model, monkeypatch):
    """open_session's context check and the Session's model load share one parse of the
    GGUF header (limits.header_of, kept per version of the file): every CLI start and
    server load used to walk the demo model's 98k vocabulary and merge strings twice.
    (The tiny model: the parse is counted, not timed.)"""
    from geniex.llama import gguf_file
    parsed = []
    real = gguf_file._read_one
    monkeypatch.setattr(gguf_file, "_read_one", lambda path: parsed.append(path) or real(path))
    limits._header.cache_clear()
    for _ in range(2):
        gx.load(str(tiny_model), nctx=256).close()
    assert parsed == [tiny_model]
