"""The hub client against a hostile (or broken) hub: the fake Hub on loopback, real HTTP."""
import hashlib
import io
import subprocess
import sys

import pytest

from fakehub import FakeHub, make_gguf
from geniex.errors import GenieXError
from geniex.store import Store
from geniex.store.errors import HubError
from geniex.store.hub import MAX_LISTING_PAGE, MAX_PAGES, MAX_SMALL_FILE, Hub
from shared_fixtures import ROOT

pytestmark = pytest.mark.fast   # needs no model: the fast tier

REPO = "org/Tiny-GGUF"
TOKEN = "hf_secret_token"
GGUF = make_gguf("tiny", "Q8_0", seed=1)


@pytest.fixture
def hub(fake_hub):
    fake_hub.add_repo(REPO, {"tiny-Q8_0.gguf": GGUF, "config.json": b'{"model_type": "llama"}',
                             "README.md": b"# tiny\n"})
    return fake_hub


@pytest.fixture
def other():
    """A second server on another port: where a hostile hub points its links."""
    with FakeHub() as server:
        server.add_repo(REPO, {"tiny-Q8_0.gguf": GGUF})
        yield server


def store_for(tmp_path, hub, token=TOKEN):
    return Store(tmp_path / "data", hub=Hub(endpoint=hub.url, token=token))


def test_the_token_goes_to_the_endpoints_origin_only_never_through_a_link(tmp_path, hub, other):
    hub.links[REPO] = f"{other.url}/api/models/{REPO}/tree/main?recursive=true&cursor=0"
    with pytest.raises(HubError, match="continues on another server"):
        Hub(endpoint=hub.url, token=TOKEN).list_files(REPO)
    assert other.auth == []                                   # never even asked
    assert all(auth == f"Bearer {TOKEN}" for _, auth in hub.auth)


def test_a_redirect_to_another_port_gets_no_token(tmp_path, hub, other):
    cdn = f"{other.url}/cdn/" + hashlib.sha256(GGUF).hexdigest()
    hub.redirects[(REPO, "tiny-Q8_0.gguf")] = cdn
    store_for(tmp_path, hub).pull(f"{REPO}:Q8_0", out=io.StringIO())
    assert [auth for path, auth in other.auth] == [None]      # the file came from there, without the token
    assert ("/" + REPO + "/resolve/main/tiny-Q8_0.gguf", f"Bearer {TOKEN}") in hub.auth


def test_a_listing_that_links_to_itself_is_refused_not_followed_forever(hub):
    hub.links[REPO] = f"{hub.url}/api/models/{REPO}/tree/main?recursive=true"
    with pytest.raises(HubError, match="links back to a page it already sent"):
        Hub(endpoint=hub.url, token="").list_files(REPO)
    assert len(hub.requests) == 1


def test_pagination_stops_at_the_page_limit(hub, monkeypatch):
    monkeypatch.setattr("geniex.store.hub.MAX_PAGES", 3)
    hub.page_size = 1                                         # 3 files: 3 pages, a 4th would be one too many
    hub.add_repo("org/Many", {f"f{i}.gguf": GGUF for i in range(5)})
    with pytest.raises(HubError, match="more than 3 pages"):
        Hub(endpoint=hub.url, token="").list_files("org/Many")
    assert MAX_PAGES >= 100


def test_a_gzip_bomb_in_the_listing_stops_at_the_bound(hub, monkeypatch):
    # The mechanism at a 1 MiB bound (the shipped 32 MiB one made the fake hub deflate
    # 36 MiB for the same refusal), as the page limit above.
    monkeypatch.setattr("geniex.store.hub.MAX_LISTING_PAGE", 1 << 20)
    hub.bombs[(REPO, None)] = (1 << 20) + (4 << 20)
    with pytest.raises(HubError, match="larger than 1,048,576 bytes \\(after decompression\\)"):
        Hub(endpoint=hub.url, token="").list_files(REPO)
    assert MAX_LISTING_PAGE >= 16 << 20


def test_a_gzip_bomb_as_config_json_is_ignored_after_the_bound(tmp_path, hub):
    # The bound and 4 MiB past it, as the listing's bomb above (was 64 MiB: deflated
    # twice per test by the fake hub, for the same refusal).
    hub.bombs[(REPO, "config.json")] = MAX_SMALL_FILE + (4 << 20)
    model = store_for(tmp_path, hub, token="").pull(f"{REPO}:Q8_0", out=io.StringIO())
    assert model.type == "llm" and model.path.read_bytes() == GGUF
    with pytest.raises(HubError, match="larger than 1,048,576 bytes"):
        Hub(endpoint=hub.url, token="").get_bytes(REPO, "config.json")


def test_a_zero_byte_listed_file_is_pulled(tmp_path, fake_hub):
    fake_hub.add_repo("org/Bundle", {"model-w8a16.bin": b"\1" * 100, "empty-w8a16.txt": b""})
    model = store_for(tmp_path, fake_hub, token="").pull("org/Bundle", out=io.StringIO())
    assert model.runtime == "qairt"
    assert (model.location / "empty-w8a16.txt").read_bytes() == b""
    assert not list(model.location.glob("*.partial"))


@pytest.mark.parametrize("name", [".pull.lock", ".geniex.lock", "geniex.json.tmp-1", "x.bin.partial",
                                  "model-w8a16.bin.lock"])
def test_repo_files_with_the_stores_own_names_are_refused(tmp_path, fake_hub, name):
    fake_hub.add_repo("org/Bundle", {"model-w8a16.bin": b"\1" * 100, name: b"overwrite me"})
    store = store_for(tmp_path, fake_hub, token="")
    with pytest.raises(HubError, match="the store cannot hold"):
        store.pull("org/Bundle", out=io.StringIO())
    assert not (store.models_dir / "org" / "Bundle" / "geniex.json").exists()


def test_names_with_escape_sequences_are_refused_and_shown_escaped(hub):
    hub.raw_listing[REPO] = [{"type": "file", "path": "evil\x1b[2J\x1b]0;pwned\x07.gguf", "size": 3,
                              "oid": "0" * 40}]
    with pytest.raises(HubError) as caught:
        Hub(endpoint=hub.url, token="").list_files(REPO)
    message = str(caught.value)
    assert "control characters in path" in message
    assert "\x1b" not in message and "\x07" not in message and "\\u001b[2J" in message


@pytest.mark.parametrize("entry, field", [
    ("a string", "not a JSON object"),
    ({"type": "file", "size": 3}, "path null"),
    ({"type": "file", "path": "", "size": 3}, 'path ""'),
    ({"type": "file", "path": "m.gguf", "size": "3"}, 'size of m.gguf "3"'),
    ({"type": "file", "path": "m.gguf", "size": -1}, "size of m.gguf -1"),
    ({"type": "file", "path": "m.gguf", "size": True}, "size of m.gguf true"),
    ({"type": "file", "path": "m.gguf"}, "size of m.gguf null"),
    ({"type": "file", "path": "m.gguf", "size": 3, "lfs": "x"}, "lfs of m.gguf is not an object"),
    ({"type": "file", "path": "m.gguf", "size": 3, "lfs": {"oid": "zz", "size": 3}}, 'lfs.oid of m.gguf "zz"'),
    ({"type": "file", "path": "m.gguf", "size": 3, "oid": 7}, "oid of m.gguf 7"),
    ({"type": "file", "path": "m" * 2000, "size": 3}, 'path "mmm'),
])
def test_every_malformed_listing_field_is_a_one_line_error(hub, entry, field):
    hub.raw_listing[REPO] = [entry]
    with pytest.raises(HubError) as caught:
        Hub(endpoint=hub.url, token="").list_files(REPO)
    message = str(caught.value)
    assert "malformed entry" in message and field in message and "\n" not in message


def test_a_listing_that_is_not_a_list_is_a_one_line_error(hub):
    hub.raw_listing[REPO] = {"error": "nope"}
    with pytest.raises(HubError, match="is not a JSON list"):
        Hub(endpoint=hub.url, token="").list_files(REPO)


def test_a_listed_size_larger_than_the_disk_is_refused_before_downloading(tmp_path, hub):
    hub.raw_listing[REPO] = [{"type": "file", "path": "tiny-Q8_0.gguf", "size": 1 << 60,
                              "lfs": {"oid": "a" * 64, "size": 1 << 60}}]
    with pytest.raises(GenieXError, match="free"):
        store_for(tmp_path, hub, token="").pull(f"{REPO}:Q8_0", out=io.StringIO())
    assert not any(p for _, p in hub.requests if p)         # no ranged download was started
    assert not any(path.startswith("/cdn/") for path, _ in hub.requests)


def test_the_cli_shows_one_clean_line_for_a_hostile_listing(tmp_path, hub):
    hub.raw_listing[REPO] = [{"type": "file", "path": "x\x1b[31m.gguf", "size": 1, "oid": "0" * 40}]
    env = {"HF_ENDPOINT": hub.url, "GENIEX_DATADIR": str(tmp_path / "data"), "HF_HOME": str(tmp_path / "hf"),
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "geniex", "pull", REPO], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: the listing of org/Tiny-GGUF")
    assert "\x1b" not in proc.stderr
