"""``geniex serve --https --certfile --keyfile``: a real TLS server (a self-signed
certificate made here with the openssl command), reached with ``requests`` verifying
against that certificate, and by ``geniex run``."""
import shutil
import subprocess

import pytest
import requests

from serverproc import DEMO, Server


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make the test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def server(tmp_path_factory, cert):
    with Server(tmp_path_factory.mktemp("https"), "--https", "--certfile", cert[0], "--keyfile", cert[1],
                "--nctx", "1024") as s:
        yield s


def test_answers_over_tls_verified_against_the_certificate(server, cert):
    assert server.url.startswith("https://")
    r = requests.get(server.url + "/health", verify=str(cert[0]), timeout=60)
    assert r.status_code == 200 and r.json()["status"] == "ok"
    body = {"model": DEMO, "max_tokens": 6, "messages": [{"role": "user", "content": "Hi"}]}
    r = requests.post(server.url + "/v1/chat/completions", json=body, verify=str(cert[0]), timeout=120)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    with requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, verify=str(cert[0]),
                       stream=True, timeout=120) as r:
        lines = [line for line in r.iter_lines(decode_unicode=True) if line]
    assert lines[-1] == "data: [DONE]"


def test_no_plain_http_and_no_unverified_tls(server):
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(server.url + "/health", timeout=30)            # the system's CAs do not know it
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(server.url.replace("https://", "http://") + "/health", timeout=30)
    # The server is still answering after both.
    assert server.proc.poll() is None


def test_geniex_run_over_https(server, cert, cli):
    p = cli("run", DEMO, "--host", server.url, "-p", "Hello", "--max-tokens", "4",
            env={"REQUESTS_CA_BUNDLE": str(cert[0])})
    assert p.returncode == 0, p.stderr
    assert "tok/s" in p.stderr


def test_https_flags_are_checked(cli, cert, tmp_path):
    p = cli("serve", "--https", "--certfile", cert[0])
    assert p.returncode == 2 and "--keyfile" in p.stderr
    p = cli("serve", "--certfile", cert[0], "--keyfile", cert[1])
    assert p.returncode == 2 and "--https" in p.stderr
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    p = cli("serve", "--host", "127.0.0.1:0", "--https", "--certfile", junk, "--keyfile", cert[1])
    assert p.returncode != 0 and "cannot load the certificate" in p.stderr
