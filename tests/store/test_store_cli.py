"""`geniex pull|list|rm|clean` end to end: the CLI as a subprocess against the fake Hub."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gguf_edit
import tiny_gemma4
from fakehub import make_gguf
from geniex.store import Store, demo_model_path
from geniex.store.display import human_size

ROOT = Path(__file__).resolve().parents[2]
REPO = "org/Tiny-GGUF"
BIG = make_gguf("tiny", "Q8_0", floats=65536, seed=3)  # ~260 kB: slow enough to interrupt
FILES = {"tiny-Q4_0.gguf": make_gguf("tiny", "Q4_0", seed=1), "tiny-Q8_0.gguf": BIG}


@pytest.fixture
def hub(fake_hub):
    fake_hub.add_repo(REPO, FILES)
    return fake_hub


@pytest.fixture
def env(tmp_path, hub):
    env = {k: v for k, v in os.environ.items() if k not in ("GENIEX_HFTOKEN", "HF_TOKEN", "GENIEX_LOG")}
    env.update(HF_ENDPOINT=hub.url, GENIEX_DATADIR=str(tmp_path / "data"), HF_HOME=str(tmp_path / "hf"),
               PYTHONPATH=str(ROOT))
    return env


def geniex(env, *args, check=True):
    """Run the CLI to completion; returns the CompletedProcess (stdin is not a terminal)."""
    result = subprocess.run([sys.executable, "-m", "geniex", *args], env=env, cwd=ROOT, capture_output=True,
                            text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert "Traceback" not in result.stderr, result.stderr
    if check:
        assert result.returncode == 0, result.stderr
    return result


def start(env, *args):
    return subprocess.Popen([sys.executable, "-m", "geniex", *args], env=env, cwd=ROOT, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(predicate, timeout=20):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def partial(env, name="tiny-Q8_0.gguf"):
    return Path(env["GENIEX_DATADIR"]) / "models" / REPO / f"{name}.partial"


def listed(env):
    """What the store lists, read in process: the rows ``geniex list --format json`` prints
    (``Store.list_models()``; the CLI's own listing is checked once, in
    test_list_formats_remove_and_clean), without a process start per look."""
    return {row["name"]: row for row in Store(Path(env["GENIEX_DATADIR"])).list_models()}


def test_pull_default_precision_and_summary(env):
    result = geniex(env, "pull", REPO)
    assert "No precision given; pulling org/Tiny-GGUF:Q4_0 (available: Q4_0, Q8_0)" in result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Pulled org/Tiny-GGUF:Q4_0"
    summary = dict(line.split(":", 1) for line in lines[1:])
    assert {k.strip(): v.strip() for k, v in summary.items()} == {
        "type": "llm", "runtime": "llama_cpp", "size": human_size(len(FILES["tiny-Q4_0.gguf"])),
        "location": f"{env['GENIEX_DATADIR']}/models/org/Tiny-GGUF", "precision": "Q4_0"}


def test_list_formats_remove_and_clean(env):
    geniex(env, "pull", f"{REPO}:q4_0")
    geniex(env, "pull", f"{REPO}:Q8_0")
    rows = {row["name"]: row for row in json.loads(geniex(env, "list", "--format", "json").stdout)}
    assert rows == listed(env)
    row = rows[REPO]
    assert row == {"name": REPO, "size": len(FILES["tiny-Q4_0.gguf"]) + len(BIG), "runtime": "llama_cpp",
                   "type": "llm", "precisions": ["Q4_0", "Q8_0"]}
    table = geniex(env, "ls").stdout.splitlines()
    assert table[0] == f"Models cached in {env['GENIEX_DATADIR']}/models"
    assert table[1].split() == ["NAME", "PRECISIONS", "TYPE", "RUNTIME", "SIZE"]
    assert any(line.split()[:3] == [REPO, "Q4_0,", "Q8_0"] for line in table)
    csv = geniex(env, "list", "--format", "csv").stdout.splitlines()
    assert csv[0] == "name,size,runtime,type,precisions" and f"{REPO},{row['size']},llama_cpp,llm,Q4_0 Q8_0" in csv
    if demo_model_path():
        assert "demo/SmolLM2-135M-Instruct" in listed(env)

    assert "removed org/Tiny-GGUF:Q4_0" in geniex(env, "rm", f"{REPO}:Q4_0", "-y").stdout
    assert listed(env)[REPO]["precisions"] == ["Q8_0"]
    partial(env, "tiny-Q4_0.gguf").write_bytes(b"left over")
    cleaned = geniex(env, "clean", "-y").stdout
    assert "tiny-Q4_0.gguf.partial" in cleaned and "deleted 1 item(s)" in cleaned
    assert "nothing to clean" in geniex(env, "clean").stdout
    geniex(env, "remove", REPO)  # no terminal: no question asked
    assert REPO not in listed(env)
    result = geniex(env, "rm", REPO, check=False)
    assert result.returncode == 1 and result.stderr.strip() == "error: org/Tiny-GGUF is not in the store (see `geniex list`)"


def test_ctrl_c_then_pull_again_resumes_with_range(env, hub):
    hub.throttle = 0.02
    proc = start(env, "pull", f"{REPO}:Q8_0")
    wait_for(lambda: partial(env).exists() and partial(env).stat().st_size > 20_000)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "run `geniex pull org/Tiny-GGUF:Q8_0` again to resume" in err
    have = partial(env).stat().st_size
    assert 0 < have < len(BIG) and REPO not in listed(env)
    hub.throttle = 0
    geniex(env, "pull", f"{REPO}:Q8_0")
    assert hub.cdn_gets(REPO, "tiny-Q8_0.gguf") == [None, f"bytes={have}-"]
    assert (partial(env).parent / "tiny-Q8_0.gguf").read_bytes() == BIG


def test_kill_9_mid_download_then_pull_again_resumes_to_the_exact_bytes(env, hub):
    # (what the round-based pull_faults.py tool checked before it was folded in here: a pull killed outright
    # lists nothing half-written, and the next pull resumes with Range.)
    hub.throttle = 0.02
    proc = start(env, "pull", f"{REPO}:Q8_0")
    wait_for(lambda: partial(env).exists() and partial(env).stat().st_size > 20_000)
    proc.kill()
    proc.communicate(timeout=20)
    assert REPO not in listed(env)
    hub.throttle = 0
    geniex(env, "pull", f"{REPO}:Q8_0")
    folder = partial(env).parent
    assert (folder / "tiny-Q8_0.gguf").read_bytes() == BIG
    assert not partial(env).exists() and not list(folder.glob("geniex.json.tmp-*"))
    first, second = hub.cdn_gets(REPO, "tiny-Q8_0.gguf")
    assert first is None and second.startswith("bytes=")


def test_two_pulls_of_one_model_share_one_download(env, hub):
    # The first pull crawls (a 4 kB block a second) until the second says it waits for
    # it; then the Hub is fast again. The order is awaited, not raced: a slow start of
    # the second process on a busy machine once found the download already done.
    hub.throttle = 1.0
    first = start(env, "pull", f"{REPO}:Q8_0")
    wait_for(lambda: partial(env).exists(), timeout=120)
    second = start(env, "pull", f"{REPO}:Q8_0")
    said = []
    for line in second.stderr:
        said.append(line)
        if "another pull is downloading" in line:
            break
    hub.throttle = 0
    results = [p.communicate(timeout=120) for p in (first, second)]
    assert first.returncode == 0 and second.returncode == 0, results
    assert "another pull is downloading tiny-Q8_0.gguf; waiting for it" in "".join(said), said
    assert hub.cdn_gets(REPO, "tiny-Q8_0.gguf") == [None]
    assert (partial(env).parent / "tiny-Q8_0.gguf").read_bytes() == BIG
    assert listed(env)[REPO]["precisions"] == ["Q8_0"]


def test_cut_mid_file_is_resumed_in_the_same_pull(env, hub):
    hub.cut(REPO, "tiny-Q8_0.gguf")
    result = geniex(env, "pull", f"{REPO}:Q8_0")
    assert "tiny-Q8_0.gguf: the connection closed mid-file; resuming at" in result.stderr
    assert hub.cdn_gets(REPO, "tiny-Q8_0.gguf")[1].startswith("bytes=")


def test_errors_are_one_line(env, hub):
    hub.wrong_sha(REPO, "tiny-Q4_0.gguf")
    result = geniex(env, "pull", f"{REPO}:Q4_0", check=False)
    assert result.returncode == 1 and "failed its sha256 check" in result.stderr
    assert REPO not in listed(env)
    result = geniex(env, "pull", "org/missing", check=False)
    assert result.returncode == 1 and result.stderr.startswith("error: org/missing on http://127.0.0.1:")
    assert "does not exist (HTTP 404)" in result.stderr
    hub.gate(REPO, "secret")
    result = geniex(env, "pull", f"{REPO}:Q8_0", check=False)
    assert result.returncode == 1 and "gated or private and needs a token (HTTP 401)" in result.stderr
    authorized = {**env, "GENIEX_HFTOKEN": "secret", "HF_TOKEN": "wrong"}
    assert geniex(authorized, "pull", f"{REPO}:Q8_0").returncode == 0
    result = geniex(authorized, "pull", f"{REPO}:Q3_K_S", check=False)
    assert result.stderr.strip() == "error: org/Tiny-GGUF has no precision Q3_K_S; available: Q4_0, Q8_0"
    result = geniex(env, "pull", "just-a-name", check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_local_path_and_model_type(env, tmp_path):
    (tmp_path / "mine-Q4_K_M.gguf").write_bytes(make_gguf("mine", "Q4_K_M"))
    result = geniex(env, "pull", "me/mine", "--local-path", str(tmp_path / "mine-Q4_K_M.gguf"), "--model-type", "vlm")
    assert "linked (hard link, no extra disk space)" in result.stderr
    assert "Pulled me/mine:Q4_K_M" in result.stdout
    assert listed(env)["me/mine"]["type"] == "vlm"


# -- a precision in a subfolder of the repo (issue #36) -----------------------------------
# Hub repos often keep a precision (split GGUFs above all) in a folder of its own:
# Q4_K_M/Model-Q4_K_M-00001-of-00003.gguf. The store keeps the repo's paths, so the
# shards sit beside each other as llama.cpp needs them to load the first one.

SUB = "org/Sub-GGUF"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    """A tiny generated model that loads in a blink: (whole file, its three shards)."""
    folder = tmp_path_factory.mktemp("tiny-llm")
    whole = tiny_gemma4.write_target(folder / "tiny.gguf")
    (folder / "shards").mkdir()
    return whole, gguf_edit.split(whole, folder / "shards" / "tiny-00001-of-00003.gguf")


def in_subfolder(tiny_llm, split, precision="Q4_K_M"):
    """The repo files of the tiny model in ``<precision>/``: one file, or three shards."""
    whole, shards = tiny_llm
    if not split:
        return {f"{precision}/Tiny.gguf": whole.read_bytes()}
    return {f"{precision}/Tiny-{precision}-{i:05d}-of-00003.gguf": p.read_bytes() for i, p in enumerate(shards, 1)}


def answer(env, model):
    """The CLI's short greedy answer to PROMPT with ``model``."""
    return geniex(env, "infer", str(model), "-p", PROMPT, "--max-tokens", "6").stdout


@pytest.fixture(scope="module")
def expected(tiny_llm, tmp_path_factory):
    """The answer of the tiny model loaded from its own whole file, outside any store."""
    env = {k: v for k, v in os.environ.items() if k not in ("GENIEX_HFTOKEN", "HF_TOKEN", "GENIEX_LOG")}
    env.update(GENIEX_DATADIR=str(tmp_path_factory.mktemp("data")), PYTHONPATH=str(ROOT))
    text = answer(env, tiny_llm[0])
    assert text.strip()
    return text


def model_folder(env, repo_id):
    return Path(env["GENIEX_DATADIR"]) / "models" / repo_id


@pytest.mark.parametrize("split", [False, True], ids=["whole", "split"])
def test_a_precision_in_a_subfolder_is_stored_there_listed_run_and_removed(env, hub, tiny_llm, expected, split):
    q4 = in_subfolder(tiny_llm, split)
    q8 = {"Q8_0/Tiny.gguf": make_gguf("tiny", "Q8_0", seed=4)}
    hub.add_repo(SUB, {**q4, **q8, "README.md": b"# tiny\n"})
    geniex(env, "pull", f"{SUB}:Q4_K_M")
    geniex(env, "pull", f"{SUB}:Q8_0")
    folder = model_folder(env, SUB)
    assert (folder / "Q4_K_M").is_dir() and (folder / "Q8_0").is_dir()
    for rel, data in {**q4, **q8}.items():
        assert (folder / rel).read_bytes() == data
    assert not [p for p in folder.rglob("*") if p.name.endswith((".partial", ".gguf.lock"))]

    rows = {row["name"]: row for row in json.loads(geniex(env, "list", "--format", "json").stdout)}
    assert rows[SUB] == {"name": SUB, "size": sum(map(len, [*q4.values(), *q8.values()])), "runtime": "llama_cpp",
                         "type": "llm", "precisions": ["Q4_K_M", "Q8_0"]}
    assert answer(env, f"{SUB}:Q4_K_M") == expected

    assert "removed org/Sub-GGUF:Q4_K_M" in geniex(env, "rm", f"{SUB}:Q4_K_M", "-y").stdout
    assert not (folder / "Q4_K_M").exists() and (folder / "Q8_0/Tiny.gguf").read_bytes() == q8["Q8_0/Tiny.gguf"]
    assert listed(env)[SUB]["precisions"] == ["Q8_0"]
    geniex(env, "rm", SUB, "-y")
    assert SUB not in listed(env) and not folder.exists()


def test_a_pull_interrupted_in_a_subfolder_resumes_there(env, hub, tiny_llm, expected):
    files = in_subfolder(tiny_llm, split=True)
    first = "Q4_K_M/Tiny-Q4_K_M-00001-of-00003.gguf"
    hub.add_repo(SUB, files)
    partial_file = model_folder(env, SUB) / f"{first}.partial"
    hub.throttle = 0.02
    proc = start(env, "pull", f"{SUB}:Q4_K_M")
    try:
        wait_for(lambda: partial_file.exists() and partial_file.stat().st_size > 20_000)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()         # (a no-op once it has ended)
        proc.communicate()
    assert proc.returncode == 130, err
    have = partial_file.stat().st_size
    assert 0 < have < len(files[first]) and SUB not in listed(env)
    hub.throttle = 0
    geniex(env, "pull", f"{SUB}:Q4_K_M")
    assert hub.cdn_gets(SUB, first) == [None, f"bytes={have}-"]
    for rel, data in files.items():
        assert (model_folder(env, SUB) / rel).read_bytes() == data
    assert not partial_file.exists()
    assert answer(env, SUB) == expected


def test_local_path_with_precision_subfolders(env, tmp_path, tiny_llm, expected):
    source = tmp_path / "mine"
    for rel, data in {**in_subfolder(tiny_llm, split=False, precision="Q8_0"),
                      "Q4_0/Tiny.gguf": make_gguf("tiny", "Q4_0", seed=5)}.items():
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_bytes(data)
    result = geniex(env, "pull", "me/mine:Q8_0", "--local-path", str(source))
    assert "linked (hard link, no extra disk space): 1 file(s)" in result.stderr
    folder = model_folder(env, "me/mine")
    assert (folder / "Q8_0/Tiny.gguf").samefile(source / "Q8_0/Tiny.gguf")
    assert listed(env)["me/mine"]["precisions"] == ["Q8_0"]
    assert "already present in the store" in geniex(env, "pull", "me/mine:Q8_0", "--local-path", str(source)).stderr
    assert answer(env, "me/mine") == expected
    geniex(env, "rm", "me/mine", "-y")
    assert not folder.exists() and (source / "Q8_0/Tiny.gguf").read_bytes() == tiny_llm[0].read_bytes()


# -- a split model registered with --local-path ---------------------------------------
# llama.cpp keeps a split model's metadata in its first shard: the others hold tensors
# and their split.no/split.count only. The model check reads the first shard (and its
# shards through it); the others are checked to be shards of that split.

def local_split(tiny_llm, folder, sub):
    """The tiny model's three shards in ``folder`` (in ``sub``, if given) as Q8_0, and a
    Q4_0 beside them; returns {relative path: bytes} of the shards."""
    shards = {f"{sub}Tiny-Q8_0-{i:05d}-of-00003.gguf": p.read_bytes() for i, p in enumerate(tiny_llm[1], 1)}
    other = {f"{sub.replace('Q8_0', 'Q4_0')}Tiny-Q4_0.gguf": make_gguf("tiny", "Q4_0", seed=5)}
    for rel, data in {**shards, **other}.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    return shards


@pytest.mark.parametrize("sub", ["", "Q8_0/"], ids=["flat", "subfolder"])
def test_local_path_of_a_split_model_is_stored_listed_run_and_removed(env, tmp_path, tiny_llm, expected, sub):
    source = tmp_path / "mine"
    shards = local_split(tiny_llm, source, sub)
    result = geniex(env, "pull", "me/mine:Q8_0", "--local-path", str(source))
    assert "linked (hard link, no extra disk space): 3 file(s)" in result.stderr
    folder = model_folder(env, "me/mine")
    for rel in shards:
        assert (folder / rel).samefile(source / rel)
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf")) == sorted(shards)

    rows = {row["name"]: row for row in json.loads(geniex(env, "list", "--format", "json").stdout)}
    assert rows["me/mine"] == {"name": "me/mine", "size": sum(map(len, shards.values())), "runtime": "llama_cpp",
                               "type": "llm", "precisions": ["Q8_0"]}
    assert answer(env, "me/mine:Q8_0") == expected
    assert "removed me/mine:Q8_0" in geniex(env, "rm", "me/mine", "-y").stdout
    assert not folder.exists() and "me/mine" not in listed(env)
    assert {rel: (source / rel).read_bytes() for rel in shards} == shards


@pytest.mark.parametrize("damage, says", [
    ("not a GGUF", "Tiny-Q8_0-00002-of-00003.gguf is not a GGUF model file (bad magic bytes)"),
    ("split.count 4", "Tiny-Q8_0-00002-of-00003.gguf is not a usable model shard: its split.count is 4, "
                      "but the first shard's is 3"),
    ("split.no 2", "Tiny-Q8_0-00002-of-00003.gguf is not a usable model shard: its split.no makes it shard 3 "
                   "of the split, not shard 2 as its name says"),
    ("no first shard", "Tiny-Q8_0-00002-of-00003.gguf is shard 2 of a split model, but its first shard "
                       "(-00001-of-00003.gguf), which holds the model's metadata, is not beside it"),
    ("a fourth shard", "Tiny-Q8_0-00004-of-00004.gguf is not part of the model in Tiny-Q8_0-00001-of-00003.gguf, "
                       "which is split into 3 files (its split.count)"),
])
def test_local_path_refuses_shards_that_are_not_one_whole_split(env, tmp_path, tiny_llm, damage, says):
    source = tmp_path / "mine"
    shard = lambda i: source / "Q8_0" / f"Tiny-Q8_0-{i:05d}-of-00003.gguf"  # noqa: E731
    local_split(tiny_llm, source, "Q8_0/")
    if damage == "not a GGUF":
        shard(2).write_bytes(b"<html>rate limited</html>\n")
    elif damage == "no first shard":
        shard(1).unlink()
    elif damage == "a fourth shard":
        (source / "Q8_0" / "Tiny-Q8_0-00004-of-00004.gguf").write_bytes(tiny_llm[1][2].read_bytes())
    else:
        key, value = damage.split()
        gguf_edit.edit(tiny_llm[1][1], shard(2), keys={key: int(value)})
    result = geniex(env, "pull", "me/mine:Q8_0", "--local-path", str(source), check=False)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {source}/Q8_0/") and says in result.stderr, result.stderr
    assert "me/mine" not in listed(env) and not list(model_folder(env, "me/mine").rglob("*.gguf"))
