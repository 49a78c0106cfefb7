"""A tampered data dir (another user's planted files, a damaged manifest): the store never
follows a symlink or blocks on a FIFO, and a bad manifest costs only its own model."""
import io
import json
import logging
import os
import threading

import pytest
import requests

from fakehub import make_gguf
from geniex.errors import GenieXError
from geniex.store import Store
from geniex.store.hub import Hub
from geniex.speculative.policy import CalibrationCache
from serverproc import AppServer

pytestmark = pytest.mark.fast   # needs no model: the fast tier

REPO = "org/Tiny-GGUF"
GGUF = make_gguf("tiny", "Q8_0", floats=16384, seed=3)


@pytest.fixture
def hub(fake_hub):
    fake_hub.add_repo(REPO, {"tiny-Q8_0.gguf": GGUF, "README.md": b"# tiny\n"})
    fake_hub.add_repo("org/Other-GGUF", {"other-Q8_0.gguf": make_gguf("other", "Q8_0", seed=4)})
    return fake_hub


@pytest.fixture
def store(tmp_path, hub):
    return Store(tmp_path / "data", hub=Hub(endpoint=hub.url, token=""))


@pytest.fixture
def outside(tmp_path):
    """A folder outside the data dir with a file that must survive every test."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.txt").write_text("keep me")
    return folder


def returns_within(call, seconds=20):
    """Run ``call`` in a thread: its result or its exception, or a failure if it is
    still blocked after ``seconds`` (a hang, not a timing)."""
    box = []

    def run():
        try:
            box.append((True, call()))
        except Exception as e:  # noqa: BLE001 - handed to the test
            box.append((False, e))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} blocked"
    ok, value = box[0]
    if not ok:
        raise value
    return value


def pulled(store, name=f"{REPO}:Q8_0"):
    return store.pull(name, out=io.StringIO())


def test_a_fifo_manifest_is_skipped_not_waited_on(store, caplog):
    pulled(store)
    pulled(store, "org/Other-GGUF:Q8_0")
    manifest = store.models_dir / "org" / "Tiny-GGUF" / "geniex.json"
    manifest.unlink()
    os.mkfifo(manifest)
    with caplog.at_level(logging.WARNING):
        rows = returns_within(store.list_models)
    assert [r["name"] for r in rows if r["name"].startswith("org/")] == ["org/Other-GGUF"]
    assert "geniex.json" in caplog.text
    with pytest.raises(GenieXError):
        returns_within(lambda: store.resolve(REPO))


def test_a_manifest_missing_its_name_is_skipped_with_a_warning(store, caplog):
    pulled(store)
    pulled(store, "org/Other-GGUF:Q8_0")
    path = store.models_dir / "org" / "Tiny-GGUF" / "geniex.json"
    data = json.loads(path.read_text())
    del data["name"]
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING):
        rows = store.list_models()
    assert "org/Other-GGUF" in [r["name"] for r in rows]
    assert "damaged (no model name)" in caplog.text


@pytest.mark.parametrize("damage", [
    lambda d: d["files"].clear(),                                       # a group's file has no record
    lambda d: d["files"]["tiny-Q8_0.gguf"].update(size="big"),
    lambda d: d["precisions"]["Q8_0"].update(files="tiny-Q8_0.gguf"),
    lambda d: d.update(precisions=[]),
    lambda d: d.update(runtime=7),
    lambda d: d.update(name="org/\x1b[2JTiny"),                        # would reach the terminal raw
    lambda d: d["precisions"].update({"Q8_0\x1b[31m": d["precisions"]["Q8_0"]}),
])
def test_other_damaged_manifests_are_skipped_too(store, damage):
    pulled(store)
    pulled(store, "org/Other-GGUF:Q8_0")
    path = store.models_dir / "org" / "Tiny-GGUF" / "geniex.json"
    data = json.loads(path.read_text())
    damage(data)
    path.write_text(json.dumps(data))
    assert [r["name"] for r in store.list_models() if r["name"].startswith("org/")] == ["org/Other-GGUF"]


def test_v1_models_lists_the_good_models_despite_a_bad_manifest_and_a_fifo(store):
    pulled(store)
    pulled(store, "org/Other-GGUF:Q8_0")
    (store.models_dir / "org" / "Tiny-GGUF" / "geniex.json").write_text('{"format": 1}')
    bad = store.models_dir / "org" / "Fifo-GGUF"
    bad.mkdir()
    os.mkfifo(bad / "geniex.json")
    with AppServer(store.root) as server:
        r = requests.get(f"{server.url}/v1/models", timeout=30)
    assert r.status_code == 200
    ids = [m["id"] for m in r.json()["data"]]
    assert "org/Other-GGUF:Q8_0" in ids and not any("Tiny" in i or "Fifo" in i for i in ids)


def test_rm_of_a_symlinked_model_folder_leaves_its_target_alone(store, outside):
    model = pulled(store)
    target = outside / "Tiny-GGUF"
    model.location.rename(target)                       # the real model, moved outside
    os.symlink(target, store.models_dir / "org" / "Tiny-GGUF")
    with pytest.raises(GenieXError, match="not in the store"):
        store.remove(REPO)
    assert (target / "tiny-Q8_0.gguf").read_bytes() == GGUF and (target / "geniex.json").exists()
    assert REPO not in [r["name"] for r in store.list_models()]
    store.clean()
    assert (target / "tiny-Q8_0.gguf").read_bytes() == GGUF


def test_a_symlinked_org_folder_is_not_followed(store, outside):
    model = pulled(store)
    org = store.models_dir / "org"
    org.rename(outside / "org")
    os.symlink(outside / "org", org)
    with pytest.raises(GenieXError):
        store.resolve(REPO)
    with pytest.raises(GenieXError):
        store.remove(REPO)
    assert (outside / "org" / "Tiny-GGUF" / model.path.name).read_bytes() == GGUF
    with pytest.raises(GenieXError, match="in the way"):
        pulled(store, "org/Other-GGUF:Q8_0")            # never writes through it either
    assert not (outside / "org" / "Other-GGUF").exists()


def test_rm_never_deletes_through_a_symlinked_folder_in_a_manifest_path(store, outside):
    model = pulled(store)
    folder = model.location
    (outside / "victim.gguf").write_bytes(b"not yours")
    os.symlink(outside, folder / "sub")
    manifest = json.loads((folder / "geniex.json").read_text())
    manifest["precisions"]["Q8_0"]["files"].append("sub/victim.gguf")
    manifest["files"]["sub/victim.gguf"] = {"size": 9, "sha256": None, "git_oid": None}
    (folder / "geniex.json").write_text(json.dumps(manifest))
    with pytest.raises(GenieXError, match="symlink"):
        store.remove(REPO)
    assert (outside / "victim.gguf").read_bytes() == b"not yours"
    assert (outside / "precious.txt").read_text() == "keep me"


def test_a_symlinked_model_file_is_never_loaded_from(store, outside):
    model = pulled(store)
    (outside / "x.gguf").write_bytes(GGUF)
    model.path.unlink()
    os.symlink(outside / "x.gguf", model.path)
    with pytest.raises(GenieXError, match="symlink"):
        store.resolve(REPO)


def test_a_planted_partial_symlink_is_not_written_through(store, hub, outside):
    folder = store.models_dir / "org" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    os.symlink(outside / "precious.txt", folder / "tiny-Q8_0.gguf.partial")
    model = pulled(store)
    assert (outside / "precious.txt").read_text() == "keep me"
    assert model.path.read_bytes() == GGUF and not model.path.is_symlink()


def test_a_planted_fifo_partial_and_lock_are_replaced_not_waited_on(store):
    folder = store.models_dir / "org" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "tiny-Q8_0.gguf.partial")
    os.mkfifo(folder / "tiny-Q8_0.gguf.lock")
    os.mkfifo(folder / ".pull.lock")
    model = returns_within(lambda: pulled(store), 60)
    assert model.path.read_bytes() == GGUF


def test_a_symlinked_lock_file_is_not_written_through(store, outside):
    pulled(store)
    lock = store.models_dir / "org" / "Tiny-GGUF" / ".pull.lock"
    lock.unlink(missing_ok=True)
    os.symlink(outside / "precious.txt", lock)
    store.remove(REPO)
    assert (outside / "precious.txt").read_text() == "keep me"


def test_a_garbage_lock_file_does_not_break_rm_and_clean(store):
    pulled(store)
    pulled(store, "org/Other-GGUF:Q8_0")
    (store.models_dir / "org" / "Tiny-GGUF" / ".pull.lock").write_bytes(b"overwrite me" * 100)
    (store.models_dir / "org" / "Other-GGUF" / ".geniex.lock").write_bytes(b"\xff" * 4096)
    store.clean()
    store.remove(REPO)
    store.remove("org/Other-GGUF")
    assert [r for r in store.list_models() if r["name"].startswith("org/")] == []


def test_a_fifo_calibration_cache_is_no_cache_and_is_replaced(tmp_path):
    path = tmp_path / "calibration.json"
    os.mkfifo(path)
    cache = CalibrationCache(path)
    assert returns_within(lambda: cache.get("k")) is None
    cache.put("k", ({1: 1.0, 2: 1.5}, 0.01))
    assert cache.get("k") == ({1: 1.0, 2: 1.5}, 0.01)
    assert path.is_file()


def test_a_symlinked_calibration_cache_is_neither_read_nor_written_through(tmp_path, outside):
    path = tmp_path / "calibration.json"
    (outside / "cal.json").write_text(json.dumps({"k": {"costs": {"1": 1.0}, "one_row": 0.5}}))
    os.symlink(outside / "cal.json", path)
    cache = CalibrationCache(path)
    assert cache.get("k") is None
    os.symlink(outside / "precious.txt", tmp_path / f"calibration.json.tmp-{os.getpid()}")
    cache.put("k", ({1: 1.0}, 0.5))
    assert (outside / "precious.txt").read_text() == "keep me"
    assert not path.is_symlink() and cache.get("k") == ({1: 1.0}, 0.5)


def test_a_symlinked_manifest_temp_file_is_not_written_through(store, outside):
    folder = store.models_dir / "org" / "Tiny-GGUF"
    folder.mkdir(parents=True)
    os.symlink(outside / "precious.txt", folder / f"geniex.json.tmp-{os.getpid()}")
    pulled(store)
    assert (outside / "precious.txt").read_text() == "keep me"
    assert json.loads((folder / "geniex.json").read_text())["name"] == REPO
