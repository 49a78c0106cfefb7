"""Faults during ``geniex pull``, repeated for a bounded number of rounds against the
local fake Hub (``tests/support/fakehub.py``, on 127.0.0.1: nothing leaves the machine).

Each round pulls a ~1 MB model into a fresh store under one random fault, then pulls
again without it, and checks what the store promises: the pull under fault fails
with one clear line (no traceback) or succeeds; the store never lists a file that is
not whole and verified; the second pull resumes (``Range``) or restarts and ends
with the exact bytes. Faults:

- ``cut``: the Hub closes the connection mid-file (1-3 times);
- ``kill9``: the pull is killed with SIGKILL mid-download;
- ``disk-full``: the pull may write only a few hundred kB (``RLIMIT_FSIZE``, so writes
  fail with EFBIG as on a full disk);
- ``bad-sha``: the Hub lists a wrong sha256 (the pull must refuse the file).

    python tools/reliability/pull_faults.py --rounds 40 --seed 3
"""
import argparse
import collections
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from fakehub import FakeHub, make_gguf  # noqa: E402

REPO = "org/Faulty-GGUF"
FILE = "faulty-Q8_0.gguf"
FAULTS = ("cut", "kill9", "disk-full", "bad-sha")


def pull(env, limit_bytes=None, wait=True):
    def limit():
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    proc = subprocess.Popen([sys.executable, "-m", "geniex", "pull", f"{REPO}:Q8_0"], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            preexec_fn=limit)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=300)
    return proc.returncode, err


def check_store(data, data_bytes):
    """Problems with what the store lists (empty list = fine)."""
    problems = []
    manifest = data / "models" / "org" / "Faulty-GGUF" / "geniex.json"
    if manifest.exists():
        listed = json.loads(manifest.read_text())
        for name in listed["files"]:
            path = manifest.parent / name
            if not path.is_file() or path.read_bytes() != data_bytes:
                problems.append(f"the manifest lists {name} but the file is not whole")
    leftovers = [p.name for p in manifest.parent.glob("*.tmp-*")] if manifest.parent.exists() else []
    if leftovers:
        problems.append(f"temp files left: {leftovers}")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= 1000:
        raise SystemExit("--rounds must be 1..1000")
    rng = random.Random(args.seed)
    data_bytes = make_gguf("faulty", "Q8_0", floats=256 * 1024)
    counts = collections.Counter()
    problems = []
    with FakeHub() as hub:
        hub.add_repo(REPO, {FILE: data_bytes, "README.md": b"# faulty\n"})
        for round_no in range(args.rounds):
            fault = rng.choice(FAULTS)
            tmp = Path(tempfile.mkdtemp(prefix="geniex-faults-"))
            data = tmp / "data"
            env = {k: v for k, v in os.environ.items() if k not in ("GENIEX_HFTOKEN", "HF_TOKEN", "GENIEX_LOG")}
            env.update(HF_ENDPOINT=hub.url, GENIEX_DATADIR=str(data), HF_HOME=str(tmp / "hf"), PYTHONPATH=str(ROOT))
            hub.throttle, hub.cuts, hub.bad_sha = 0.0, {}, set()
            err = ""
            if fault == "cut":
                hub.cut(REPO, FILE, times=rng.randint(1, 3))
                code, err = pull(env)
            elif fault == "kill9":
                hub.throttle = 0.002
                proc = pull(env, wait=False)
                time.sleep(rng.uniform(0.3, 2.0))
                proc.send_signal(signal.SIGKILL)
                proc.communicate(timeout=60)
                code, hub.throttle = -9, 0.0
            elif fault == "disk-full":
                code, err = pull(env, limit_bytes=rng.randint(64, 768) * 1024)
            else:
                hub.wrong_sha(REPO, FILE)
                code, err = pull(env)
                if code == 0:
                    problems.append(f"round {round_no}: a wrong sha256 was accepted")
                hub.bad_sha = set()
            if "Traceback" in err:
                problems.append(f"round {round_no} ({fault}): traceback:\n{err[-1500:]}")
            elif code not in (0, -9) and len(err.strip().splitlines()) > 3:
                problems.append(f"round {round_no} ({fault}): a long error:\n{err[-800:]}")
            problems += [f"round {round_no} ({fault}): {p}" for p in check_store(data, data_bytes)]
            code2, err2 = pull(env)                     # again, without the fault
            final = data / "models" / "org" / "Faulty-GGUF" / FILE
            if code2 != 0 or not final.is_file() or final.read_bytes() != data_bytes:
                problems.append(f"round {round_no} ({fault}): the pull after the fault did not complete: {err2[-500:]}")
            counts[f"{fault} ({'failed cleanly' if code not in (0, -9) else 'killed' if code == -9 else 'succeeded'})"] += 1
            subprocess.run(["rm", "-rf", str(tmp)], check=False)
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"rounds {args.rounds}, problems {len(problems)}")
    for p in problems[:10]:
        print("  " + p)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
