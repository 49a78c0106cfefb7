"""Issue 12 regressions against a real server over HTTP (and the CLI where the defect
was the CLI's). Two shared in-process servers (``create_app()``): one with the default
security settings (plus a small queue and body limit), one with an API key, an allowed
host, a CORS origin and ``--allow-paths``; ``geniex serve`` itself where its command
line and environment are what is tested."""
import concurrent.futures as futures
import json
import os
import re
import socket

import pytest
import requests

from awaiting import queued, until
from geniex.llama.kv import PROMPT_CHUNK
from serverproc import DEMO, AppServer, Server, chat_body, check_shape

KEY = "sekrit-key"
GOOD_ORIGIN = "http://good.example"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """Default security settings; a queue of 1 and a 64 KiB body limit to test them."""
    with AppServer(tmp_path_factory.mktemp("plain-data"), nctx=1024, parallel=1, max_queue=1, max_body=64 << 10) as s:
        yield s


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    with AppServer(tmp_path_factory.mktemp("keyed-data"), nctx=512, api_key=KEY, allowed_hosts="myhost.example",
                   origins=GOOD_ORIGIN, allow_paths=True) as s:
        yield s


AUTH = {"Authorization": f"Bearer {KEY}"}


def error_of(r, status):
    assert r.status_code == status, (r.status_code, r.text)
    check_shape(r.json(), "Error")
    return r.json()["error"]


def raw_request(server, head, body=b""):
    """Send bytes as they are (headers requests would refuse); returns the raw answer."""
    host, port = server.host.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(head + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return head.decode(errors="replace"), payload


# -- request bodies -------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    b'{"model": "demo", "messages": [], "temperature": NaN}',
    b'{"model": "demo", "messages": [], "top_p": Infinity}',
    b'{"model": "demo", "messages": [], "min_p": -Infinity}',
    b'{"model": "demo", "messages": [], "presence_penalty": 1e999}',
    b'[' * 1000 + b']' * 1000,
    b'{"model": "demo", "messages": [{"role": "user", "content": "a\\udc00b"}]}',
])
def test_bodies_python_accepts_but_json_does_not_are_400s(plain, raw):
    r = requests.post(plain.url + "/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
    error_of(r, 400)


@pytest.mark.parametrize("field", ["nctx", "seed", "top_k", "max_completion_tokens"])
def test_integral_floats_are_400s_not_500s(plain, field):
    err = error_of(plain.chat(chat_body(**{field: 3.0})), 400)
    assert err["param"] == field


def test_a_body_over_the_limit_is_a_413_in_openais_shape(plain):
    err = error_of(plain.chat(chat_body("x" * 70_000)), 413)
    assert "--max-body" in err["message"] and "65536" in err["message"]
    # A chunked body (no Content-Length) is cut off too.
    r = requests.post(plain.url + "/v1/chat/completions", data=iter([b"{" + b" " * 40_000] * 3),
                      headers={"Content-Type": "application/json"})
    error_of(r, 413)


def test_405_says_which_methods_are_allowed(plain):
    r = requests.delete(plain.url + "/v1/models")
    error_of(r, 405)
    assert "GET" in r.headers["Allow"]
    assert "POST" in requests.get(plain.url + "/v1/chat/completions").headers["Allow"]


def test_a_control_character_in_a_header_gets_a_json_400(plain):
    body = json.dumps({"model": DEMO, "messages": []}).encode()
    head, payload = raw_request(plain, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                       b"Content-Type: application/json\r\nGenieX-KeepCache: tr\x01ue\r\n"
                                       b"Content-Length: %d\r\n\r\n" % len(body), body)
    assert head.startswith("HTTP/1.0 400") or head.startswith("HTTP/1.1 400"), head
    assert "application/json" in head
    assert json.loads(payload)["error"]["type"] == "invalid_request_error"


# -- context size --------------------------------------------------------------------------


def test_nctx_beyond_the_trained_context_is_refused_before_a_load(plain):
    loads = plain.health()["loads"]
    err = error_of(plain.chat(chat_body(nctx=131072)), 400)
    assert err["param"] == "nctx" and "8192" in err["message"]
    err = error_of(plain.chat(chat_body(nctx=2147483648)), 400)
    assert err["param"] == "nctx"
    assert plain.health()["loads"] == loads         # nothing was loaded (or freed) for them


# -- models by path ---------------------------------------------------------------------------


def test_requests_name_store_models_only_by_default(plain, demo_model, tmp_path):
    fifo = tmp_path / "x.gguf"
    os.mkfifo(fifo)
    names = ["/etc/passwd", str(demo_model), str(tmp_path), str(tmp_path / "missing.gguf"), str(fifo)]
    messages = set()
    for name in names:
        for r in (plain.chat(chat_body(model=name)), plain.get(f"/v1/models/{name}"),
                  plain.chat(chat_body(spec_type="draft-simple", spec_draft_model=name))):
            err = error_of(r, 404)
            assert "--allow-paths" in err["message"], err
            messages.add(err["message"].replace(name, "NAME"))
    # Nothing in the answers tells whether a path exists, is a folder, a FIFO or a GGUF.
    assert len(messages) == 2, messages        # the model's message and the draft model's


def test_with_allow_paths_a_non_gguf_model_is_the_same_404_as_under_models(keyed, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    via_chat = error_of(keyed.chat(chat_body(model=str(text)), headers=AUTH), 404)
    via_models = error_of(keyed.get(f"/v1/models/{text}", headers=AUTH), 404)
    assert via_chat["message"] == via_models["message"] and via_chat["code"] == "model_not_found"


def test_a_fifo_named_by_path_cannot_block_the_server(keyed, tmp_path):
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    # Opening a FIFO for reading blocks until a writer comes: a server that opened it
    # would never answer (the requests' own timeout ends the test then).
    with futures.ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda i: keyed.get(f"/v1/models/{fifo}", headers=AUTH) if i % 2 else
                                keyed.chat(chat_body(model=str(fifo)), headers=AUTH), range(10)))
    for r in answers:
        assert "not a regular file" in error_of(r, 404)["message"]
    assert keyed.health()["status"] == "ok"


# -- who may call ----------------------------------------------------------------------------------


def test_cors_is_off_and_other_origins_are_refused_by_default(plain):
    pre = requests.options(plain.url + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    # Answered as llama-server answers it: no CORS headers, which a browser takes as no.
    assert pre.status_code == 200 and "Access-Control-Allow-Origin" not in pre.headers
    # Even a "simple" cross-origin POST (no preflight) is refused before it runs.
    r = requests.post(plain.url + "/v1/chat/completions", data=json.dumps(chat_body()),
                      headers={"Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert error_of(r, 403)["code"] == "origin_not_allowed"
    assert "Access-Control-Allow-Origin" not in r.headers
    assert "Access-Control-Allow-Origin" not in plain.get("/v1/models", headers={"Origin": "null"}).headers
    # The server's own pages (the Swagger UI) send their own origin.
    assert plain.get("/v1/models", headers={"Origin": plain.url}).status_code == 200


def test_the_host_header_must_be_loopback_or_allowed(plain, keyed):
    port = plain.host.split(":")[1]
    for host in (f"evil.example:{port}", "attacker.test", f"192.168.1.7:{port}"):
        err = error_of(plain.get("/v1/models", headers={"Host": host}), 403)
        assert err["code"] == "host_not_allowed"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]", "app.localhost"):
        assert plain.get("/v1/models", headers={"Host": host}).status_code == 200, host
    assert keyed.get("/v1/models", headers={"Host": "myhost.example:1234", **AUTH}).status_code == 200
    error_of(keyed.get("/v1/models", headers={"Host": "other.example", **AUTH}), 403)


def test_the_api_key_is_required_on_v1_and_the_docs_stay_open(keyed):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        r = keyed.get("/v1/models", headers=headers)
        assert error_of(r, 401)["code"] == "invalid_api_key"
        assert r.headers["WWW-Authenticate"] == "Bearer"
    error_of(keyed.chat(chat_body()), 401)
    assert keyed.get("/v1/models", headers=AUTH).status_code == 200
    for path in ("/docs/", "/openapi.json", "/health", "/docs/swagger-ui.css"):
        assert keyed.get(path).status_code == 200, path
    assert keyed.get("/").status_code == 200                # redirected to the docs


def test_listed_origins_get_cors_and_a_preflight_needs_no_key(keyed):
    pre = requests.options(keyed.url + "/v1/chat/completions", headers={
        "Origin": GOOD_ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200 and pre.headers["Access-Control-Allow-Origin"] == GOOD_ORIGIN
    assert "Authorization" in pre.headers["Access-Control-Allow-Headers"]
    r = keyed.get("/v1/models", headers={"Origin": GOOD_ORIGIN, **AUTH})
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == GOOD_ORIGIN
    error_of(keyed.get("/v1/models", headers={"Origin": "http://evil.example", **AUTH}), 403)
    pre = requests.options(keyed.url + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 200 and "Access-Control-Allow-Origin" not in pre.headers


def test_geniex_run_sends_the_key(keyed, cli):
    p = cli("run", "-p", "Hi", "--max-tokens", "2", env={"GENIEX_HOST": keyed.host, "GENIEX_API_KEY": KEY})
    assert p.returncode == 0, p.stderr
    p = cli("run", "-p", "Hi", "--max-tokens", "2", "--api-key", KEY, env={"GENIEX_HOST": keyed.host})
    assert p.returncode == 0, p.stderr
    p = cli("run", "-p", "Hi", "--max-tokens", "2", env={"GENIEX_HOST": keyed.host})
    assert p.returncode != 0 and "API key" in p.stderr


def test_the_key_may_come_from_the_environment_and_open_binding_warns(tmp_path):
    with Server(tmp_path, env={"GENIEX_API_KEY": "from-env"}) as s:
        error_of(s.get("/v1/models"), 401)
        assert s.get("/v1/models", headers={"Authorization": "Bearer from-env"}).status_code == 200
    with Server(tmp_path, "--host", "0.0.0.0:0") as s:
        s.get("/health")
    assert "no API key" in s.stderr and "--api-key" in s.stderr


# -- starvation: the queue and a client that leaves --------------------------------------------------


def test_a_full_queue_answers_503_with_retry_after(plain):
    long = {"model": DEMO, "prompt": "1, 2, 3, 4, 5,", "max_tokens": 2000, "stream": True}
    short = {"model": DEMO, "prompt": "1, 2,", "max_tokens": 2}
    with futures.ThreadPoolExecutor(1) as pool:
        # A streamed answer holds the model until its last event or until its client leaves.
        with requests.post(plain.url + "/v1/completions", json=long, stream=True, timeout=120) as first:
            # Keep the line iterator: dropping it closes the connection (urllib3 throws a
            # generator it finalizes away), and the first answer would end right there.
            lines = first.iter_lines()
            next(lines)                                         # the stream has started
            second = pool.submit(plain.post, "/v1/completions", short)
            queued(plain.cache, 1)                              # the second is now waiting
            third = plain.post("/v1/completions", short)
            assert not first.raw.closed and lines is not None   # the first answer was held all along
        assert second.result().status_code == 200               # its turn came when the first left
    err = error_of(third, 503)
    assert err["code"] == "server_busy" and int(third.headers["Retry-After"]) > 0
    assert err["type"] == "service_unavailable_error"


def test_a_client_that_leaves_during_its_prompt_stops_the_work(plain):
    # In process, the server's log is this process's: the test reads it as the user would.
    # The server's own context (1,024 cells: no reload) and a prompt of two chunks
    # (geniex.llama.kv.PROMPT_CHUNK rows each).
    plain.chat(chat_body(messages=[]))                               # the model resident first
    prompt = " ".join(f"item {i} weighs {i * 7 % 13} grams." for i in range(90))    # ~880 tokens
    body = json.dumps(chat_body(prompt, max_tokens=1, stream=True)).encode()
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    host, port = plain.host.split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head + body)
        until(lambda: plain.cache.busy, what="the prompt to be processed")
    # Gone: the prompt stops at its next chunk and the log says so.
    # The line of this prompt's cancellation (the shared server's log may hold other requests' lines).
    stopped = re.compile(r"request cancelled .* while its prompt was processed; stopped after (\d+) of (\d+) prompt tokens")
    until(lambda: stopped.search(plain.stderr), timeout=180, what="the cancellation in the log")
    done, total = map(int, stopped.search(plain.stderr).groups())
    assert done < total and total > PROMPT_CHUNK                            # more than one chunk, not all of it
    r = plain.chat(chat_body(max_tokens=2))                          # and the server answers again
    assert r.status_code == 200, r.text


# -- drafts longer than a verify batch --------------------------------------------------------------
# A batch of more rows than the context's n_batch aborts inside llama.cpp. Two guards: the
# settings stop at MAX_DRAFT (256, half the batch), checked here at both surfaces, and the
# loop cuts any draft to what the batch holds (tests/engine/test_loop_replay.py
# test_a_drafter_cannot_overfill_the_verify_batch).


def test_a_600_token_ngram_draft_is_a_400_naming_the_field(plain):
    loads = plain.health()["loads"]
    err = error_of(plain.chat(chat_body(spec_type="ngram-mod", spec_ngram_max=600)), 400)
    assert err["param"] == "spec_ngram_max" and "256" in err["message"]
    assert plain.health()["loads"] == loads


def test_a_600_token_ngram_draft_is_a_usage_error_in_infer(cli):
    p = cli("infer", "--spec-type", "ngram-mod", "--ngram-max", "600", "-p", "hi")
    assert p.returncode == 2 and "--ngram-max" in p.stderr and "256" in p.stderr, p.stderr
