"""Issue 12 regressions that need no server process: strict JSON bodies, integers that
are integers, schema maxima, the context limit, the Host guard, the bounded queue,
FIFOs refused before opening, store-only name resolution, a full disk while the
manifest is written, and the OpenAPI document."""
import io
import json
import os
import threading

import pytest

from awaiting import queued
from geniex.engine import limits
from geniex.errors import ModelLoadError, ModelNotFound, UsageError
from geniex.llama.gguf_file import open_regular, read_header
from geniex.server import body as body_json
from geniex.server import guard, openapi
from geniex.server.cache import CacheKey, ModelCache
from geniex.server.validation import ApiError, validate
from geniex.store import Store
from geniex.store.errors import StoreError
from geniex.store import manifest as manifest_module
from geniex.store.manifest import MANIFEST
from geniex.store.resolved import from_gguf_path

pytestmark = pytest.mark.fast   # needs no model: the fast tier


def rejected(raw):
    with pytest.raises(ApiError) as e:
        body_json.parse(raw)
    assert e.value.status == 400
    return e.value


# -- strict JSON ---------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
def test_non_finite_numbers_are_refused_at_parse_time(token):
    err = rejected(f'{{"model": "m", "temperature": {token}}}'.encode())
    assert "not a finite number" in err.message and err.code == "invalid_json"


def test_a_lone_surrogate_is_refused_naming_the_field():
    raw = json.dumps({"messages": [{"role": "user", "content": "a\udc00b"}]}).encode()
    err = rejected(raw)
    assert err.param == "messages[0].content" and "surrogate" in err.message


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_deep_nesting_is_a_400_not_a_recursion_error(depth):
    assert "nested more than" in rejected(b"[" * depth + b"]" * depth).message
    nested = b'{"a":' * depth + b"1" + b"}" * depth
    assert "nested more than" in rejected(nested).message


def test_ordinary_bodies_still_parse():
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo \U0001F600 [{\"x"}],
            "temperature": 0.5, "seed": 3}
    assert body_json.parse(json.dumps(body).encode()) == body
    assert "not UTF-8" in rejected(b'{"a": "\xff"}').message
    assert "empty" in rejected(b"").message


# -- schemas: integers, maxima ---------------------------------------------------------------


def chat(**extra):
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **extra}


@pytest.mark.parametrize("field", ["nctx", "seed", "top_k", "max_tokens", "max_completion_tokens", "ngl"])
def test_integral_floats_are_refused_where_the_schema_says_integer(field):
    with pytest.raises(ApiError) as e:
        validate(chat(**{field: 3.0}), "chat_completions.request.json")
    assert e.value.param == field and "write 3, without a decimal point" in e.value.message
    validate(chat(**{field: 3}), "chat_completions.request.json")


def test_integral_floats_are_refused_by_the_completions_schema_too():
    with pytest.raises(ApiError) as e:
        validate({"model": "m", "prompt": "x", "max_tokens": 16.0}, "completions.request.json")
    assert e.value.param == "max_tokens"


@pytest.mark.parametrize("extra, param", [
    ({"nctx": 2**31}, "nctx"),
    ({"max_tokens": 10**9}, "max_tokens"),
    ({"max_completion_tokens": 2**40}, "max_completion_tokens"),
    ({"temperature": 1e300}, "temperature"),
    ({"repetition_penalty": 1e6}, "repetition_penalty"),
    ({"seed": 2**64}, "seed"),
    ({"top_k": 2**40}, "top_k"),
    ({"stop": ["x"] * 17}, "stop"),
    ({"stop": "x" * 1025}, "stop"),
    ({"compute": "c" * 257}, "compute"),
    ({"model": "m" * 1025}, "model"),
    ({"messages": [{"role": "user", "content": "x"}] * 4097}, "messages"),
    ({"messages": [{"role": "user", "name": "n" * 257}]}, "messages[0].name"),
])
def test_counts_and_sizes_have_maxima(extra, param):
    with pytest.raises(ApiError) as e:
        validate({**chat(), **extra}, "chat_completions.request.json")
    assert e.value.status == 400 and e.value.param == param, e.value.message


# -- the context limit -------------------------------------------------------------------------


class Model:
    def __init__(self, path):
        self.path, self.name = path, "demo"


def test_context_beyond_the_trained_one_is_refused_when_asked_and_cut_when_defaulted(demo_model):
    m = Model(demo_model)
    trained = limits.trained_context(read_header(demo_model))
    assert trained == 8192
    with pytest.raises(UsageError, match="more than demo was trained for \\(8192 tokens\\)"):
        limits.context_size(m, 131072, explicit=True, field="nctx")
    with pytest.raises(UsageError, match="nctx 2147483648"):
        limits.context_size(m, 2**31, explicit=True, field="nctx")
    assert limits.context_size(m, 131072, explicit=False) == trained
    assert limits.context_size(m, 1024) == 1024


def test_context_beyond_the_memory_budget_is_refused_naming_what_fits(demo_model):
    m = Model(demo_model)
    per_token = limits.kv_bytes_per_token(read_header(demo_model))
    assert per_token == 30 * 3 * (64 + 64) * 2       # layers x kv heads x (K+V width) x f16
    budget = 1000 * per_token
    with pytest.raises(UsageError, match="use at most 1000"):
        limits.context_size(m, 2048, budget=budget)
    assert limits.context_size(m, 1000, budget=budget) == 1000


def test_sizes_parse():
    assert limits.parse_size("8M") == 8 << 20 and limits.parse_size("512k") == 512 << 10
    assert limits.parse_size("1.5G") == 3 << 29 and limits.parse_size("100") == 100
    for bad in ("", "-1", "lots", "0"):
        with pytest.raises(UsageError):
            limits.parse_size(bad)


# -- the Host guard ------------------------------------------------------------------------------


def test_host_names():
    assert guard.host_name("Example.COM:8080") == "example.com"
    assert guard.host_name("[::1]:18181") == "::1"
    for name in ("localhost", "app.localhost", "127.0.0.1", "127.5.6.7", "::1"):
        assert guard.is_loopback(name), name
    for name in ("example.com", "10.0.0.1", "localhost.example.com", "0.0.0.0", ""):
        assert not guard.is_loopback(name), name


# -- the bounded queue ----------------------------------------------------------------------------


class _Resident:
    name = "m"
    speculative = False

    def close(self):
        pass


def _key():
    return CacheKey("m", 4096, -1, ("CPU",), ("q8_0", "q8_0"), ())


def test_the_model_cache_refuses_beyond_max_queue():
    cache = ModelCache(keepalive=-1, max_queue=1)
    held = cache.lease(_key(), lambda _: _Resident())    # free: taken even with a short queue
    got = []
    waiter = threading.Thread(target=lambda: got.append(cache.lease(_key(), lambda _: _Resident())))
    waiter.start()
    queued(cache, 1)
    with pytest.raises(ApiError) as refused:            # one already waits: refused at once
        cache.lease(_key(), lambda _: _Resident())
    assert refused.value.status == 503 and refused.value.headers["Retry-After"]
    held.release()
    waiter.join(5)
    assert len(got) == 1
    got[0].release()
    cache.close()


def test_a_waiting_request_whose_client_left_gives_up_its_place():
    cache = ModelCache(keepalive=-1)
    held = cache.lease(_key(), lambda _: _Resident())
    gone = threading.Event()
    got = []

    def wait():
        try:
            got.append(cache.lease(_key(), lambda _: _Resident(), cancel=gone.is_set))
        except ApiError as e:
            got.append(e.code)
    waiter = threading.Thread(target=wait)
    waiter.start()
    queued(cache, 1)
    gone.set()                                  # the client went away while waiting
    waiter.join(5)
    assert got == ["request_cancelled"] and not waiter.is_alive()
    assert cache.waiting() == 0 and cache.in_use() == 1   # nobody left in the queue; still held by the first
    held.release()
    with cache.lease(_key(), lambda _: _Resident()):
        assert cache.in_use() == 1
    cache.close()


# -- files that are not regular ---------------------------------------------------------------


def test_a_fifo_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    result = []

    def attempt():
        for call in (open_regular, read_header, from_gguf_path):
            try:
                call(fifo)
                result.append("opened")
            except ModelLoadError as e:
                result.append(str(e))
    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "reading the FIFO blocked"
    assert len(result) == 3 and all("not a regular file" in r for r in result), result
    with pytest.raises(ModelLoadError, match="not a regular file"):
        read_header("/dev/zero")


def test_store_only_resolution_never_looks_outside_the_store(tmp_path, demo_model):
    store = Store(tmp_path / "data")
    assert store.resolve("demo", paths=False).name.startswith("demo/")
    messages = set()
    for name in ("/etc/passwd", str(demo_model), str(tmp_path), str(tmp_path / "nothing.gguf"),
                 "../../etc/passwd", "./x.gguf", "~/x.gguf"):
        with pytest.raises(ModelNotFound) as e:
            store.resolve(name, paths=False)
        messages.add(str(e.value).replace(repr(name), "NAME"))
    # The answer depends on the text alone: an existing file and a missing one read alike.
    assert len(messages) == 1, messages
    assert store.resolve(str(demo_model)).path == demo_model     # the CLI still takes paths


# -- a full disk while the manifest is written --------------------------------------------------


def test_a_full_disk_while_writing_the_manifest_is_a_clear_error_and_leaves_no_temp_file(tmp_path, demo_model,
                                                                                        monkeypatch):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    store = Store(tmp_path / "data")
    folder = store.models_dir / "test" / "full"
    folder.mkdir(parents=True)
    # The manifest's temp file is written to /dev/full: every write fails with ENOSPC
    # from the kernel, as on a full disk. (The store never writes through a symlink
    # planted at the temp file's name, so the device is opened in its place.)
    real_open = manifest_module.files.open_for_writing

    def full_disk(path, **kwargs):
        if path.name.startswith(f"{MANIFEST}.tmp-"):
            real_open(path, **kwargs).close()            # the temp file exists, as on a real disk
            return open("/dev/full", "wb")
        return real_open(path, **kwargs)
    monkeypatch.setattr(manifest_module.files, "open_for_writing", full_disk)
    with pytest.raises(StoreError) as e:
        store.pull("test/full:Q4_1", local_path=demo_model, out=io.StringIO(), interactive=False)
    assert "No space left on device" in str(e.value) and "unchanged" in str(e.value)
    assert not os.path.lexists(folder / f"{MANIFEST}.tmp-{os.getpid()}")
    assert not (folder / MANIFEST).exists()
    assert [m["name"] for m in store.list_models()] == ["demo/SmolLM2-135M-Instruct"]


# -- the OpenAPI document ------------------------------------------------------------------------


def test_openapi_allows_the_warm_up_null_and_declares_the_bearer_key():
    doc = openapi.document()
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    schema = chat["responses"]["200"]["content"]["application/json"]["schema"]
    assert {"type": "null"} in schema["anyOf"]
    assert doc["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    assert {"bearerAuth": []} in chat["security"]
    assert {"413", "503", "401", "403"} <= set(chat["responses"])
    assert "security" not in doc["paths"]["/health"]["get"]
