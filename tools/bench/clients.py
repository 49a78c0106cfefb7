#!/usr/bin/env python3
"""What a client sees from geniex's server and from llama.cpp's, each at its own defaults (#33).

    python tools/bench/clients.py --quick                   # smoke run: small files, 1 round
    python tools/bench/clients.py [--rounds 3] [--json FILE] [--scenarios cold,two-at-once]

Both servers serve the bundled demo model over ``/v1/chat/completions``, streamed and
greedy; every time is taken by the client (time to first token: from sending the request
to the first chunk carrying answer text). geniex is ``python -m geniex serve`` with a
private data dir; llama.cpp is ``xllamacpp.Server`` (the same b11549 library) in a
subprocess of its own, set as ``llama-server`` starts by default: 4 slots over a unified
KV cache, 8 GiB of host memory for prompts. Each round asks every scenario on content no
earlier round (or scenario) asked, so nothing replays a cached prompt. Concurrent answers
are checked against the same request answered alone (``cache_prompt: false``).
"""
import argparse
import datetime
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from bench import busy_warnings  # noqa: E402

MODEL = "demo/SmolLM2-135M-Instruct:Q4_1"
SLOT_CTX, SLOTS = 4096, 4            # llama.cpp: 4 slots of geniex's context each
SYSTEM = "You are a coding assistant working in a repository. Answer briefly and precisely."
PAUSE = 1.0                          # seconds between turns in returning-paused
CHARS_PER_TOKEN = 3.0                # the generated files, by llama.cpp's /tokenize of the demo model


# -- content: fresh per round, scenario and agent ---------------------------------------
NOUNS = ("request answer cache token prompt slot server client model batch queue worker session context "
         "window layer buffer stream chunk reply agent turn file line index table record field value key").split()
VERBS = "load save read write parse render split merge count check build send take keep drop find sort trim".split()
SMALL = "the a of to in for with when each every only then so that it".split()
LINES = ("    {a} = {f}({b}, {n})", "    if {a} > {n}:", "        {a}.{v}({b})", "    # {s}",
         "    for {a} in {b}.{v}_all():", "        {a}[{n}] = {b}", "    {a} += len({b}) - {n}")


def rng(r, scenario, who):
    """The generator of round ``r``'s content for one conversation of a scenario."""
    return random.Random(f"{r}:{scenario}:{who}")


def sentence(g, words):
    return " ".join(g.choice(NOUNS + VERBS + SMALL) for _ in range(words)).capitalize()


def code_file(g, tokens):
    """About ``tokens`` tokens of plausible Python; returns (text, a function it defines)."""
    out, names = [], []
    while sum(map(len, out)) < tokens * CHARS_PER_TOKEN:
        names.append(f"{g.choice(VERBS)}_{g.choice(NOUNS)}")
        out += [f"def {names[-1]}({g.choice(NOUNS)}, {g.choice(NOUNS)}):", f'    """{sentence(g, 10)}."""']
        for _ in range(g.randint(3, 7)):
            out.append(g.choice(LINES).format(a=g.choice(NOUNS), b=g.choice(NOUNS), v=g.choice(VERBS),
                                              n=g.randint(0, 999), f=f"{g.choice(VERBS)}_{g.choice(NOUNS)}",
                                              s=sentence(g, 8)))
        out += [f"    return {g.choice(NOUNS)}", ""]
    return "\n".join(out), g.choice(names)


def long_conv(g, tokens):
    """A conversation's first turn: the system prompt, a file and a question about it."""
    text, fn = code_file(g, tokens)
    ask = f"Here is the file.\n\n```python\n{text}```\n\nWhat does {fn} do, and what could go wrong in it?"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}], fn


def follow_up(conv, answer, g, fn):
    """The conversation's next turn: its answer, and a ~70-token follow-up question."""
    ask = f"Now rewrite {fn} so that {sentence(g, 45).lower()}. Keep the rest of the file as it is."
    return conv + [{"role": "assistant", "content": answer}, {"role": "user", "content": ask}]


def short_conv(g):
    """A short question: a ~40-token prompt, the template's own system turn included."""
    return [{"role": "user", "content": f"In one line: why would {sentence(g, 6).lower()}?"}]


# -- the client ---------------------------------------------------------------------------
@dataclass
class Reply:
    sent: float            # perf_counter times, so concurrent replies share a clock
    first: float
    end: float
    text: str
    prompt_tokens: int     # the whole prompt (usage)
    processed: int         # of them computed, not reused from a cache (timings.prompt_n)

    @property
    def ttft(self):
        return self.first - self.sent


def ask(url, messages, n, cache=True):
    """One streamed, greedy chat request; ``cache=False`` computes the prompt afresh."""
    body = {"model": MODEL, "messages": messages, "max_tokens": n, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if not cache:
        body["cache_prompt"] = False
    first, text, usage, timings = None, [], {}, {}
    sent = time.perf_counter()
    with requests.post(url + "/v1/chat/completions", json=body, stream=True, timeout=900) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{url}: {resp.status_code} {resp.text[:500]}")
        # chunk_size=None: hand on each chunk as it arrives (a fixed size waits to fill it).
        for line in resp.iter_lines(chunk_size=None, decode_unicode=True):
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
            usage, timings = event.get("usage") or usage, event.get("timings") or timings
    end = time.perf_counter()
    prompt = usage.get("prompt_tokens", 0)
    return Reply(sent, first or end, end, "".join(text), prompt, timings.get("prompt_n", prompt))


def at_once(url, convs, n):
    """The conversations sent together: one thread each, released by one barrier."""
    gate = threading.Barrier(len(convs))

    def one(conv):
        gate.wait()
        return ask(url, conv, n)
    with ThreadPoolExecutor(len(convs)) as pool:
        return list(pool.map(one, convs))


def same_alone(url, convs, replies, n):
    """How many concurrent answers equal the same request answered alone, computed afresh."""
    return sum(ask(url, c, n, cache=False).text == x.text for c, x in zip(convs, replies))


# -- scenarios: each returns its figures, by row ---------------------------------------------
def cold(url, r, z):
    reply = ask(url, long_conv(rng(r, "cold", "A"), z.file)[0], z.answer)
    return {"TTFT s": reply.ttft, "prompt tokens": reply.prompt_tokens, "prompt computed": reply.processed,
            "prompt tok/s": reply.prompt_tokens / reply.ttft}


def returning(url, r, z):
    (a, fa), (b, fb) = long_conv(rng(r, "returning", "A"), z.file), long_conv(rng(r, "returning", "B"), z.file)
    a1, b1 = ask(url, a, z.answer), ask(url, b, z.answer)
    a2 = ask(url, follow_up(a, a1.text, rng(r, "returning", "A2"), fa), z.answer)
    b2 = ask(url, follow_up(b, b1.text, rng(r, "returning", "B2"), fb), z.answer)
    return {"A2 TTFT s": a2.ttft, "A2 prompt computed": a2.processed, "B2 TTFT s": b2.ttft,
            "B2 prompt computed": b2.processed}


def returning_after_a_pause(url, r, z):
    """As ``returning``, but each agent comes back a second after the other's answer (as
    an agent does that runs a tool or a test between turns): a server may use the pause."""
    (a, fa), (b, fb) = long_conv(rng(r, "paused", "A"), z.file), long_conv(rng(r, "paused", "B"), z.file)
    a1 = ask(url, a, z.answer)
    time.sleep(PAUSE)
    b1 = ask(url, b, z.answer)
    time.sleep(PAUSE)
    a2 = ask(url, follow_up(a, a1.text, rng(r, "paused", "A2"), fa), z.answer)
    time.sleep(PAUSE)
    b2 = ask(url, follow_up(b, b1.text, rng(r, "paused", "B2"), fb), z.answer)
    return {"A2 TTFT s": a2.ttft, "A2 prompt computed": a2.processed, "B2 TTFT s": b2.ttft,
            "B2 prompt computed": b2.processed}


def two_at_once(url, r, z):
    convs = [long_conv(rng(r, "two", who), z.file)[0] for who in "AB"]
    replies = at_once(url, convs, z.answer)
    return {"slower TTFT s": max(x.ttft for x in replies),
            "both answered s": max(x.end for x in replies) - min(x.sent for x in replies),
            "same as alone": (same_alone(url, convs, replies, z.answer), len(convs))}


def four_short(url, r, z):
    convs = [short_conv(rng(r, "four", who)) for who in "ABCD"]
    replies = at_once(url, convs, 32)
    return {"all answered s": max(x.end for x in replies) - min(x.sent for x in replies),
            "prompt tokens": statistics.mean(x.prompt_tokens for x in replies),
            "same as alone": (same_alone(url, convs, replies, 32), len(convs))}


def subagent(url, r, z):
    a, fn = long_conv(rng(r, "subagent", "A"), z.file)
    a1 = ask(url, a, z.answer)
    ask(url, short_conv(rng(r, "subagent", "S")), 32)
    a2 = ask(url, follow_up(a, a1.text, rng(r, "subagent", "A2"), fn), z.answer)
    return {"A's next TTFT s": a2.ttft, "A's prompt computed": a2.processed}


SCENARIOS = {
    "cold": (cold, "one conversation's first turn: system prompt + file + question"),
    "returning": (returning, "agents A and B take turns (A1, B1, A2, B2); A2 and B2 are returning turns"),
    "returning-paused": (returning_after_a_pause, "as returning, each turn sent a second after the last "
                                                  "answer (an agent running a tool between turns)"),
    "two-at-once": (two_at_once, "two different first turns sent at the same moment"),
    "four-short": (four_short, "four short questions (32-token answers) sent at the same moment"),
    "subagent": (subagent, "A's first turn, a short subagent request, then A's next turn"),
}


# -- the servers ---------------------------------------------------------------------------
class Served:
    """A server in a subprocess that prints its address on its first stdout line; the
    rest of its output goes to ``log``."""

    def __init__(self, name, argv, log, env=None, by_stdin=False):
        self.name, self.log, self.by_stdin = name, log, by_stdin
        with open(log, "w") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         text=True, env=env, cwd=ROOT)
        line = self.proc.stdout.readline()
        found = re.search(r"https?://[\d.]+:\d+", line)
        if not found:
            self.close()
            raise SystemExit(f"{name} did not start ({line!r}); its log: {log}")
        self.url = found.group(0)
        # Drained so that a chatty server never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def close(self):
        # llama.cpp's side ends when its stdin closes; geniex's ends on SIGTERM.
        self.proc.stdin.close()
        if not self.by_stdin:
            self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_geniex(workdir, calibration=None):
    env = {**os.environ, "GENIEX_DATADIR": str(workdir / "geniex-data"), "PYTHONUNBUFFERED": "1"}
    if calibration:
        # Read at the model's load (before any figure is taken); without it the load measures.
        (workdir / "geniex-data").mkdir(exist_ok=True)
        shutil.copyfile(calibration, workdir / "geniex-data" / "calibration.json")
    env.pop("GENIEX_HOST", None)
    return Served("geniex", [sys.executable, "-m", "geniex", "serve", "--host", "127.0.0.1:0"],
                  workdir / "geniex.log", env)


def start_llamacpp(workdir, model_path):
    return Served("llama.cpp", [sys.executable, __file__, "--serve-llamacpp", str(model_path)],
                  workdir / "llama.cpp.log", by_stdin=True)


def serve_llamacpp(model_path):
    """The llama.cpp subprocess: llama-server's command-line defaults (threads, 512-row
    micro-batches, F16 KV, prompt cache on) with the slots a user gets from them, each of
    geniex's context; prints the address and serves until stdin closes. Its own process:
    its copy of the library never shares one with geniex's."""
    import xllamacpp as x
    p = x.CommonParams()
    p.model.path = model_path
    p.n_parallel = SLOTS
    p.kv_unified = True
    p.cache_ram_mib = 8192
    p.n_ctx = SLOTS * SLOT_CTX
    p.hostnames = ["127.0.0.1"]
    p.port = 0
    server = x.Server(p)
    print(server.listening_address, flush=True)
    sys.stdin.read()
    del server


def settings(geniex, llamacpp):
    """What each side ran, as far as it says: llama.cpp's slots and context from /props,
    its threads from its log; geniex's from its defaults (every physical core)."""
    from geniex.config import physical_cores
    props = requests.get(llamacpp.url + "/props", timeout=60).json()
    threads = re.findall(r"n_threads = (\d+)", llamacpp.log.read_text(errors="replace"))
    health = requests.get(geniex.url + "/health", timeout=60).json()
    return {"geniex": "geniex serve at its defaults: nctx 4096 per slot, q8_0 KV cache, prompts read in an F16 "
                      "cache in 512-row calls (--prompt-kv f16), prompts reused, conversations kept in host "
                      "memory (--cache-ram 8192), "
                      f"{health.get('slots') or '?'} slots with one KV stream each, their rows in one decode, "
                      f"{physical_cores()} threads",
            "llama.cpp": f"llama.cpp server (xllamacpp b11549) at llama-server's defaults: {props['total_slots']} "
                         f"slots over a unified KV cache (n_ctx {SLOTS * SLOT_CTX} asked, "
                         f"{props['default_generation_settings']['n_ctx']} per slot as it reports), F16 KV cache, "
                         f"512-row micro-batches, cache_prompt on, --cache-ram 8192, "
                         f"{threads[0] if threads else '?'} threads"}


# -- the run ---------------------------------------------------------------------------------
@dataclass
class Sizes:
    file: int           # tokens in a conversation's file
    answer: int         # tokens a long conversation's turn answers


def table(name, rounds):
    """One scenario's medians over rounds, and the median of the per-round ratios."""
    rows = rounds[0]["geniex"][name].keys()
    out = [f"\n## {name}: {SCENARIOS[name][1]}\n", "| | geniex | llama.cpp | geniex / llama.cpp |",
           "|---|---:|---:|---:|"]
    for row in rows:
        g, n = ([x[side][name][row] for x in rounds] for side in ("geniex", "llama.cpp"))
        if row == "same as alone":
            out.append(f"| {row} | {sum(a for a, _ in g)}/{sum(b for _, b in g)} | "
                       f"{sum(a for a, _ in n)}/{sum(b for _, b in n)} | |")
            continue
        ratios = [a / b for a, b in zip(g, n) if b]
        better = "higher" if row.endswith("/s") else "lower" if row.endswith(" s") else ""
        ratio = f"{statistics.median(ratios):.2f}" + (f" ({better} is better)" if better else "") if ratios else ""
        out.append(f"| {row} | {statistics.median(g):.3g} | {statistics.median(n):.3g} | {ratio} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, help="rounds (default 3; quick 1); rows are medians")
    ap.add_argument("--quick", action="store_true", help="small files (~300 tokens), short answers, 1 round")
    ap.add_argument("--scenarios", help="comma list (default: all): " + ", ".join(SCENARIOS))
    ap.add_argument("--json", type=Path, help="save the figures here")
    ap.add_argument("--calibration", type=Path, metavar="FILE",
                    help="start geniex's data dir with this calibration cache (a data dir's calibration.json): its "
                         "load with slots then reads the verify costs instead of measuring them (the suite's smoke "
                         "run: measured once per run)")
    ap.add_argument("--serve-llamacpp", metavar="MODEL", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_llamacpp:
        return serve_llamacpp(args.serve_llamacpp)
    chosen = args.scenarios.split(",") if args.scenarios else list(SCENARIOS)
    if set(chosen) - set(SCENARIOS):
        raise SystemExit(f"unknown scenario {', '.join(set(chosen) - set(SCENARIOS))}; known: {', '.join(SCENARIOS)}")
    n_rounds = args.rounds or (1 if args.quick else 3)
    sizes = Sizes(300, 16) if args.quick else Sizes(1700, 64)
    from geniex.store.demo import INSTALL_HINT, demo_model_path
    model_path = demo_model_path()
    if model_path is None:
        raise SystemExit(f"the demo model is not installed: {INSTALL_HINT}")

    # A terminated run still stops both servers (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))
    cpus, workdir = os.cpu_count() or 1, Path(tempfile.mkdtemp(prefix="geniex-clients-"))
    load_start, rounds, servers = os.getloadavg()[0], [], []
    try:
        # One after the other, so that neither's load competes with the other's (and the
        # first is stopped below if the second fails to start).
        servers.append(start_geniex(workdir, args.calibration))
        servers.append(start_llamacpp(workdir, model_path))
        for s in servers:
            ask(s.url, short_conv(random.Random("warm")), 2)        # loads geniex's model
        ran = settings(servers[0], servers[1])
        print(f"# clients bench: {model_path.name}, {n_rounds} round(s), files ~{sizes.file} tokens, "
              f"answers {sizes.answer} tokens; {cpus} CPUs; logs in {workdir}")
        for line in ran.values():
            print(f"# {line}")
        for r in range(n_rounds):
            figures = {"round": r, "load_before": os.getloadavg()[0]}
            for i, name in enumerate(chosen):
                # Alternate who goes first, so a busy spell does not always hit the same side.
                for s in (servers if (r + i) % 2 == 0 else servers[::-1]):
                    figures.setdefault(s.name, {})[name] = SCENARIOS[name][0](s.url, r, sizes)
            figures["load_after"] = os.getloadavg()[0]
            rounds.append(figures)
            busy = busy_warnings(figures["load_before"], [figures["load_after"]], [], cpus, {})
            print(f"# round {r + 1}/{n_rounds}: load average {figures['load_before']:.2f} -> "
                  f"{figures['load_after']:.2f}" + (" (busy: its figures are doubtful)" if busy else ""), flush=True)
    finally:
        for s in servers:
            s.close()

    for name in chosen:
        print(table(name, rounds))
    loads = [x[k] for x in rounds for k in ("load_before", "load_after")]
    warnings = busy_warnings(load_start, loads, [], cpus, {})
    for line in warnings:
        print(f"WARNING: {line}")
    if args.json:
        meta = {"when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "model": model_path.name,
                "cpus": cpus, "quick": args.quick, "rounds": n_rounds, "sizes": vars(sizes),
                "settings": ran, "load_before": load_start, "warnings": warnings}
        args.json.write_text(json.dumps({"meta": meta, "rounds": rounds}, indent=1) + "\n", encoding="utf-8")
        print(f"\n# figures in {args.json}")


if __name__ == "__main__":
    sys.exit(main())
