"""N concurrent clients against a real ``geniex serve`` for a bounded time, with mixed
speculative settings; every answer must equal the sequential baseline.

Starts the server on a free loopback port (only loopback: this tool never targets
another host) with a throw-away data dir and the demo model. First answers each
(prompt, settings) pair once, alone: the baseline. Then ``--clients`` threads send
random pairs (greedy, so the text is determined) for ``--seconds``, some streamed,
some cut off mid-stream on purpose (``--disconnect-share``) to check that a client
leaving frees the model. Prints requests sent, answers, 503 busy answers (retried),
mismatches against the baseline, errors, and whether the server survived.

    python tools/reliability/load_server.py --clients 8 --seconds 120
"""
import argparse
import collections
import concurrent.futures as futures
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_server import start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = "demo/SmolLM2-135M-Instruct:Q4_1"
PROMPTS = ["Say hello.", "List three colours.", "Repeat exactly: the cat sat on the mat. the cat sat on the mat.",
           "What is 2 + 2?", "Write one sentence about rivers."]
# Bounded settings (each is one model load: the server reloads when spec_* change).
SETTINGS = [
    {},
    {"spec_type": "ngram-mod"},
    {"spec_type": "ngram-simple", "spec_ngram_max": 6},
    {"spec_type": "draft-simple", "spec_draft_model": DEMO, "spec_n_max": 4},
]


def body(prompt, settings, max_tokens):
    return {"model": DEMO, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, **settings}


def answer(url, payload, stream, cut=False):
    """The answer's text; ``cut`` leaves after the first event (returns None)."""
    if not stream:
        r = requests.post(url + "/v1/chat/completions", json=payload, timeout=600)
        if r.status_code != 200:
            return r.status_code, r.text
        return 200, r.json()["choices"][0]["message"]["content"]
    with requests.post(url + "/v1/chat/completions", json={**payload, "stream": True}, stream=True,
                       timeout=600) as r:
        if r.status_code != 200:
            return r.status_code, r.text
        text = []
        for line in r.iter_lines(decode_unicode=True):
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            if cut:
                return 200, None
            event = json.loads(line[5:])
            if "error" in event:
                return 500, event["error"]["message"]
            text.append((event["choices"][0]["delta"] or {}).get("content") or "")
        return 200, "".join(text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=120, help="how long the clients run (default 120)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--disconnect-share", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if not 1 <= args.clients <= 64 or not 0 < args.seconds <= 3600:
        raise SystemExit("--clients must be 1..64 and --seconds 0..3600")
    data = Path(tempfile.mkdtemp(prefix="geniex-load-"))
    proc, url = start_server(data, ["--max-queue", str(args.clients)], 1024)
    print(f"server {url} (log: {data / 'server.log'})", flush=True)
    counts = collections.Counter()
    problems = []
    lock = threading.Lock()
    try:
        pairs = [(p, i) for p in PROMPTS for i in range(len(SETTINGS))]
        baseline = {}
        for prompt, i in pairs:
            status, text = answer(url, body(prompt, SETTINGS[i], args.max_tokens), stream=False)
            if status != 200:
                raise SystemExit(f"baseline failed ({status}): {text}")
            baseline[(prompt, i)] = text
        print(f"baseline: {len(baseline)} answers", flush=True)
        end = time.monotonic() + args.seconds

        def client(n):
            rng = random.Random(args.seed * 1000 + n)
            while time.monotonic() < end:
                prompt, i = rng.choice(pairs)
                stream = rng.random() < 0.5
                cut = stream and rng.random() < args.disconnect_share
                try:
                    status, text = answer(url, body(prompt, SETTINGS[i], args.max_tokens), stream, cut)
                except requests.RequestException as e:
                    status, text = "connection", str(e)
                with lock:
                    counts["requests"] += 1
                    if status == 503:
                        counts["busy (503, retried)"] += 1
                        time.sleep(1)
                    elif status != 200:
                        counts["errors"] += 1
                        problems.append((status, str(text)[:200]))
                    elif cut:
                        counts["cut off on purpose"] += 1
                    elif text == baseline[(prompt, i)]:
                        counts["identical to baseline"] += 1
                    else:
                        counts["mismatches"] += 1
                        problems.append(("mismatch", prompt, SETTINGS[i], text, baseline[(prompt, i)]))

        with futures.ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(client, range(args.clients)))
        alive = proc.poll() is None
        health = requests.get(url + "/health", timeout=60).json() if alive else None
    finally:
        proc.terminate()
        proc.wait(60)
    log_text = (data / "server.log").read_text()
    print(", ".join(f"{k}: {v}" for k, v in counts.items()))
    print(f"server alive at the end: {alive}; /health: {health}; tracebacks in its log: {log_text.count('Traceback')}")
    for p in problems[:10]:
        print("  ", p)
    ok = alive and not counts["errors"] and not counts["mismatches"] and "Traceback" not in log_text
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
