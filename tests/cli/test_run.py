"""``geniex run``: a chat client of a running server (the real app in process, the real
CLI as a subprocess)."""
import re
import shutil

import pytest

from serverproc import DEMO, AppServer

PROFILE_LINE = re.compile(r"^— [\d.]+ tok/s • \d+ tok • [\d.]+ s first token( • \d+% accept)? —$", re.M)


@pytest.fixture(scope="module")
def server(tmp_path_factory, calibration_cache):
    data = tmp_path_factory.mktemp("run-data")
    # The suite's calibration cache, as data_dir has it: a speculative load finds the
    # demo model's curves instead of measuring them.
    shutil.copyfile(calibration_cache, data / "calibration.json")
    with AppServer(data) as s:
        yield s


def test_two_turn_chat_reuses_the_servers_kv_cache(server, cli):
    # A first turn past 64 tokens: the server reads it in F16 and turn 2 reads only what is new.
    p = cli("run", DEMO, "--host", server.host, "-p", "Hi, my name is Bob. I keep a lighthouse on a small island in "
            "the north, where the winters are long and the storms come in from the sea every week.",
            "-p", "What is my name?",
            "--max-tokens", "12", "--verbose")
    assert p.returncode == 0, p.stderr
    blocks = re.findall(r"total time:.*?stop reason:\s+\w+", p.stderr, re.S)
    assert len(blocks) == 2
    assert "reused from cache" not in blocks[0]
    assert re.search(r"\((\d+) reused from cache\)", blocks[1])      # turn 2 decoded only its new tokens
    assert len([line for line in p.stdout.splitlines() if line.strip()]) >= 2
    # The server saw the warm-up and both turns on one load.
    assert server.health()["loads"] >= 1 and server.health()["model"] == DEMO


def test_profile_line_is_the_same_as_infer_prints(server, cli):
    p = cli("run", "--host", server.host, "-p", "Hello", "--max-tokens", "4")
    assert p.returncode == 0, p.stderr
    assert len(PROFILE_LINE.findall(p.stderr)) == 1, p.stderr
    assert "accept" not in p.stderr


def test_speculative_flags_travel_as_request_fields(server, cli):
    p = cli("run", DEMO, "--host", server.host, "--spec-type", "draft-simple", "--draft-model", DEMO,
            "--draft-tokens", "4", "-p", "Repeat exactly: the cat sat on the mat. the cat sat on the mat.",
            "--max-tokens", "24", "--verbose", "--draft-policy", "fixed")
    assert p.returncode == 0, p.stderr
    assert re.search(r"draft accept:\s+(\d+)/\1 \(100\.0%\)", p.stderr), p.stderr
    assert server.health()["speculative"]


def test_interactive_session_from_stdin(server, cli):
    p = cli("run", "--host", server.host, "--max-tokens", "4", input="Hello\n/clear\nHi again\n/bye\n")
    assert p.returncode == 0, p.stderr
    assert len(PROFILE_LINE.findall(p.stderr)) == 2
    assert "(conversation cleared)" in p.stderr


def test_no_server_listening(cli, unused_port):
    p = cli("run", "--host", f"127.0.0.1:{unused_port}", "-p", "hi")
    assert p.returncode == 1
    assert f"no geniex server is listening on http://127.0.0.1:{unused_port}; start one with `geniex serve`" in p.stderr


def test_host_from_the_environment(server, cli):
    p = cli("run", "-p", "Hi", "--max-tokens", "2", env={"GENIEX_HOST": server.host})
    assert p.returncode == 0, p.stderr


def test_model_or_draft_not_in_the_store(server, cli):
    p = cli("run", "nobody/nothing:Q4_0", "--host", server.host, "-p", "hi")
    assert p.returncode == 1 and "geniex pull nobody/nothing:Q4_0" in p.stderr
    p = cli("run", "--host", server.host, "-p", "hi", "--spec-type", "draft-mtp", "--draft-model", "RachidAR/x:Q4_0")
    assert p.returncode == 1
    assert "resolve draft model RachidAR/x:Q4_0: not found; run `geniex pull RachidAR/x:Q4_0`" in p.stderr


def test_spec_trace_is_refused_with_a_pointer_to_infer(cli):
    p = cli("run", "-p", "hi", "--spec-trace", "-")
    assert p.returncode == 2 and "geniex infer --spec-trace" in p.stderr


@pytest.fixture
def unused_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
