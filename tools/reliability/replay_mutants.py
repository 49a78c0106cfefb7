"""Replay GGUF mutants (gguf_mutants.py) through ``geniex infer`` or ``geniex serve``, and
count what each did.

``infer`` (the default): each mutant is written to a scratch folder and run as
``python -m geniex infer PATH -p hi --max-tokens 4`` with a time limit. Outcomes:

- ``clear error``: exit code 1 or 2 and one ``error:`` line on stderr;
- ``answered``: exit code 0 (the change did not matter to the model, or made it say
  other things);
- ``abort``: killed by a signal (SIGABRT, SIGSEGV, ... inside llama.cpp);
- ``traceback``: a Python traceback on stderr;
- ``hang``: still running at the time limit (then killed);
- ``other``: anything else (a several-line error, an unexpected exit code).

``--serve``: one ``geniex serve`` for the whole run. Each mutant is registered with
``geniex pull org/mutant-N --local-path FILE``; one the pull refuses is planted instead
(the pristine model is registered, then its stored file overwritten with the mutant's
bytes, as a tampered data dir would hold it). Then the mutant is requested, and a
request for the demo model must still be answered after it. Counted: pulls refused,
answers by status, server deaths (the server is restarted after one), mutant requests
still running at the time limit (they hold the one model: they block everyone) and
demo requests not answered after a mutant.

    python tools/reliability/replay_mutants.py --count 420 --seed 21
    python tools/reliability/replay_mutants.py --serve --count 100 --seed 21
    python tools/reliability/replay_mutants.py --only 17 -v      # one mutant, its output shown
"""
import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import gguf_mutants  # noqa: E402
from local_server import start_server  # noqa: E402

OUTCOMES = ("clear error", "answered", "abort", "traceback", "hang", "other")


def classify(returncode, stderr, timed_out):
    """One of OUTCOMES for a finished (or killed) ``geniex infer``."""
    if timed_out:
        return "hang"
    if "Traceback (most recent call last)" in stderr:
        return "traceback"
    if returncode < 0:
        return "abort"
    if returncode == 0:
        return "answered"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if returncode in (1, 2) and len(errors) == 1:
        return "clear error"
    return "other"


def _env(data_dir):
    env = {k: v for k, v in os.environ.items() if k not in ("GENIEX_LOG", "GENIEX_HOST")}
    env.update(GENIEX_DATADIR=str(data_dir), PYTHONUNBUFFERED="1")
    return env


def run_infer(path, data_dir, timeout):
    """``(outcome, returncode, stderr)`` of one ``geniex infer``."""
    proc = subprocess.Popen([sys.executable, "-m", "geniex", "infer", str(path), "-p", "hi", "--max-tokens", "4"],
                            cwd=ROOT, env=_env(data_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, errors="replace", start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        timed_out = True
    return classify(proc.returncode, err, timed_out), proc.returncode, err


def _last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def replay_infer(source, chosen, args, scratch):
    counts = collections.Counter()
    by_kind = collections.defaultdict(collections.Counter)
    bad = []
    path = scratch / "mutant.gguf"
    for m in chosen:
        m.write(source, path)
        outcome, rc, err = run_infer(path, scratch / "data", args.timeout)
        counts[outcome] += 1
        by_kind[m.kind][outcome] += 1
        if outcome not in ("clear error", "answered"):
            bad.append((m, outcome, rc, err))
        if args.verbose:
            print(f"{m.index:4d} {m.kind:14s} {outcome:12s} {m.description} -> {_last_line(err)}", flush=True)
        path.unlink(missing_ok=True)
    _print_table("infer", counts, by_kind, len(chosen))
    for m, outcome, rc, err in bad:
        print(f"\n#{m.index} {m.kind}: {m.description}: {outcome} (exit {rc})\n  " + "\n  ".join(err.strip().splitlines()[-6:]))
    return counts


def _print_table(where, counts, by_kind, total):
    print(f"\n| where | mutants | {' | '.join(OUTCOMES)} |")
    print("|---|---|" + "---|" * len(OUTCOMES))
    print(f"| {where} | {total} | " + " | ".join(str(counts[o]) for o in OUTCOMES) + " |")
    print(f"\n| kind | mutants | {' | '.join(OUTCOMES)} |")
    print("|---|---|" + "---|" * len(OUTCOMES))
    for kind in sorted(by_kind):
        row = by_kind[kind]
        print(f"| {kind} | {sum(row.values())} | " + " | ".join(str(row[o]) for o in OUTCOMES) + " |")


def _geniex(data_dir, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "geniex", *map(str, args)], cwd=ROOT, env=_env(data_dir),
                          capture_output=True, text=True, errors="replace", timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _chat(url, model, timeout):
    """``(status or None, body text)``; None when no answer came in ``timeout`` seconds
    (or the connection failed)."""
    body = json.dumps({"model": model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, urllib.error.URLError) as e:
        return None, str(e)


def _stored_file(data_dir, name):
    manifest = json.loads((data_dir / "models" / "org" / name / "geniex.json").read_text())
    (group,) = manifest["precisions"].values()
    return data_dir / "models" / "org" / name / group["files"][0]


def replay_serve(source, chosen, args, scratch):
    data = scratch / "data"
    data.mkdir(exist_ok=True)
    pristine = scratch / "pristine.gguf"
    shutil.copyfile(source.path, pristine)   # a copy: the store links to it, never to the source
    counts = collections.Counter()
    server, url = start_server(data, ["--keepalive", "0"], 2048)
    try:
        for m in chosen:
            name = f"mutant-{m.index:04d}"
            path = scratch / f"{name}.gguf"
            m.write(source, path)
            pulled = _geniex(data, "pull", f"org/{name}", "--local-path", path)
            if pulled.returncode != 0:
                counts["pull refused"] += 1
                if "Traceback" in pulled.stderr:
                    counts["pull traceback"] += 1
                    print(f"#{m.index} pull traceback: {m.description}\n{pulled.stderr[-800:]}")
                # Planted: a tampered store holds the same bytes under a registered name.
                path.unlink()
                copy = scratch / f"{name}-pristine.gguf"
                shutil.copyfile(pristine, copy)
                _geniex(data, "pull", f"org/{name}", "--local-path", copy).check_returncode()
                stored = _stored_file(data, name)
                stored.unlink()
                m.write(source, stored)
                copy.unlink()
            else:
                path.unlink()
            status, text = _chat(url, f"org/{name}", args.timeout)
            counts[f"answered {status}" if status else "no answer"] += 1
            if status is None:
                counts["held the server past the limit"] += 1
            died = server.poll() is not None
            if not died:
                ok, _ = _chat(url, "demo", args.timeout)
                if ok != 200:
                    counts["demo request not answered after it"] += 1
                    died = server.poll() is not None
            if args.verbose:
                print(f"{m.index:4d} {m.kind:14s} pull {'ok' if pulled.returncode == 0 else 'refused'}, "
                      f"status {status}{', SERVER DIED' if died else ''}: {m.description} -> {text[:160]}",
                      flush=True)
            if died:
                counts["server deaths"] += 1
                print(f"#{m.index} killed the server: {m.kind}: {m.description}", flush=True)
                server, url = start_server(data, ["--keepalive", "0"], 2048)
            _geniex(data, "rm", f"org/{name}")
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
    print(f"\nserve: {len(chosen)} mutants")
    for key in ("server deaths", "held the server past the limit", "demo request not answered after it",
                "pull refused", "pull traceback"):
        counts[key] += 0                 # shown even when none
    for key in sorted(counts):
        print(f"  {key}: {counts[key]}")
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    gguf_mutants.add_arguments(ap)
    ap.add_argument("--start", type=int, default=0, help="first mutant to replay (to split a run)")
    ap.add_argument("--stop", type=int, help="replay mutants before this one")
    ap.add_argument("--only", type=int, help="replay this mutant only")
    ap.add_argument("--timeout", type=float, default=120, help="seconds before a run counts as a hang")
    ap.add_argument("--serve", action="store_true", help="replay through `geniex serve` instead of infer")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per mutant")
    args = ap.parse_args(argv)
    source, made = gguf_mutants.from_arguments(args)
    chosen = [made[args.only]] if args.only is not None else made[args.start:args.stop]
    scratch = Path(tempfile.mkdtemp(prefix="geniex-mutants-"))
    t0 = time.monotonic()
    try:
        counts = (replay_serve if args.serve else replay_infer)(source, chosen, args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\n{len(chosen)} mutants (seed {args.seed}) in {time.monotonic() - t0:.0f} s")
    if args.serve:
        return 1 if counts["server deaths"] or counts["held the server past the limit"] else 0
    return 1 if any(counts[o] for o in ("abort", "traceback", "hang", "other")) else 0


if __name__ == "__main__":
    sys.exit(main())
