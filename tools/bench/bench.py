#!/usr/bin/env python3
"""Decode speed of geniex's loop, against itself and against llama.cpp's own loop.

    python tools/bench/bench.py [--tokens N] [--rounds R] [--quick] [--markdown F] [--plot F.png]

On the demo model (SmolLM2-135M Q4_1), greedy, five workloads: open prose, a code edit
whose answer repeats the input, quoting a passage, a second edit of the same code (an
agent's next request) and a chat's second turn that quotes the first answer again.

- ours: ``Session.generate`` as ``geniex infer`` builds it, plain and with each drafting
  method (n-gram methods with their defaults and the draft policy ``auto``; ``fixed``
  rows draft as long as the drafter offers; ``fresh`` rows forget the n-gram memory
  before every run);
- native: llama.cpp's own server loop (``xllamacpp.Server``: the same b11549 library,
  driven by its C++ server and speculative code), given the same prompt token ids.
  Each side runs **at its own defaults** (what a user who starts it gets: ours every
  physical core, micro-batch 32, q8_0 KV cache; native its own thread choice, micro-batch
  512, F16 KV cache), and native runs again at ours' settings (``=`` rows). Native
  ngram-mod keeps its table across requests, as its server does (``fresh``: a new server
  per run; ``own``: its own 24/48/64 parameters). Only this benchmark uses xllamacpp's
  Python API; geniex never does. Its HTTP listener is bound to 127.0.0.1; requests go
  through ``Server.handle_completions``.

Every configuration lives in its own worker process (ours and native alike, so the
scheduler treats them the same), loaded once. Every round runs every configuration
once per workload, in a rotated order, so slow spells of a shared machine hit all
configurations alike. Speeds are medians over rounds; ratios are medians of per-round
ratios (paired within a round), with their geometric mean over workloads. Absolute
tok/s are noisy on a shared VM: read ratios. A warning is printed when multi-threaded
batches stall (another process on a core).

Also printed: acceptance and the accepted-length histogram per method, tokens per
verify step, "bandwidth achieved" (model bytes x tok/s, as gpt-fast prints it), the
Python time per step outside ``llama_decode``, what a verify batch of k rows costs
against a one-row decode, and whether each speculative answer equals the plain answer
token for token (it must).
"""
import argparse
import contextlib
import io
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

NCTX = 4096
ROW_KS = (1, 2, 4, 8, 16)

# ---------------------------------------------------------------------------------
# Prompts: open prose, a code edit whose answer repeats the input, quoting/summarising.

CODE = '''def compute_total(items):
    total = 0
    for item in items:
        total += item.price * item.quantity
    return total


def print_receipt(items):
    for item in items:
        print(f"{item.name}: {item.price * item.quantity}")
    print("Total:", compute_total(items))
'''

PASSAGE = ("The lighthouse stood at the edge of the cliff for more than a hundred years. "
           "Every night its keeper climbed the spiral stairs to light the lamp. "
           "Ships passing in the storm relied on its beam to find the harbour. "
           "When the keeper grew old, the town installed an electric light, "
           "but the people still called the tower by his name.")

PROMPTS = {
    "prose": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "code-edit": ("Rename the function compute_total to sum_prices everywhere in this code. "
                  "Reply with the full updated code only.\n\n```python\n" + CODE + "```"),
    "quote": ("Here is a passage:\n\n" + PASSAGE + "\n\nQuote the first two sentences of the "
              "passage exactly, then summarize the passage in one sentence."),
    # An agent's second edit of the same file: the code (and the first edit's answer)
    # were seen before, by a drafter that remembers earlier answers.
    "code-edit-2": ("Rename the function print_receipt to show_receipt everywhere in this code. "
                    "Reply with the full updated code only.\n\n```python\n" + CODE + "```"),
    # A chat's second turn that quotes the first answer again (built at start: the first
    # turn's answer is the plain greedy answer to "prose").
    "chat-quote": None,
}
CHAT_QUOTE_ASK = "Repeat your story above word for word, but give the keeper the name Ada."


# ---------------------------------------------------------------------------------
# Configurations

@dataclass
class Config:
    name: str
    side: str                       # "ours" | "native"
    spec: str = ""                  # "" plain, an n-gram type, or "draft-simple"
    threads: int = 0                # one-row decodes (0 = the side's default: all cores)
    threads_batch: int = 0          # multi-row batches (verify, prefill; 0 = the side's default)
    ngram: tuple = ()               # (n, min, max) for n-gram methods
    draft_tokens: int = 3           # draft-simple: --draft-tokens (geniex's default)
    env: dict = field(default_factory=dict)
    ubatch: int = 0                 # micro-batch rows (0 = the side's default: ours 32, native 512)
    cache: str = ""                 # KV cache type, K and V ("" = the side's default: ours q8_0, native f16)
    policy: str = "auto"            # ours: --draft-policy
    adaptive: bool = True           # ours: the thread governor (geniex/llama/threads.py)
    # Forget what drafting learned before every run: ours resets its n-gram memory, native
    # gets a fresh worker (llama.cpp's server keeps its ngram-mod table across requests).
    fresh: bool = False

    @property
    def plain(self):
        return not self.spec


@dataclass
class Run:
    tokens: list                    # committed answer tokens (ours); [] for native
    text: str
    tok_s: float
    n: int
    decode_s: float
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    hist: list = field(default_factory=list)
    draft_s: float = 0.0
    in_lib_s: float = 0.0           # time inside the target's llama_decode, verify steps only


def physical_cores():
    from geniex.config import physical_cores as pc
    return pc()


def env_variants(args):
    """(label, environment) for each --env / --passive variant of ours."""
    out = []
    if args.passive:
        out.append(("passive", {"OMP_WAIT_POLICY": "PASSIVE"}))
    for item in args.env or ():
        key, _, value = item.partition("=")
        out.append((item, {key: value}))
    return out


def make_configs(args):
    """Each side at its defaults (what a user who starts it sees), and native again at
    ours' settings (equal threads, micro-batch and KV cache: the loops compared alone)."""
    from geniex.speculative.options import NGRAM_DEFAULTS as DEFAULTS
    T, TB = args.threads, args.threads_batch
    if args.methods:
        methods = [m for m in args.methods if m != "none"]
    elif args.quick:
        methods = ["ngram-mod"]
    else:
        methods = ["ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "draft-simple"]
    equal = dict(threads=T or physical_cores(), threads_batch=TB or physical_cores(), ubatch=32, cache="q8_0")
    cfgs = [Config("ours plain", "ours", "", T, TB)]
    for m in methods:
        cfgs.append(Config(f"ours {m}", "ours", m, T, TB, ngram=DEFAULTS.get(m, ())))
        if not args.quick:
            cfgs.append(Config(f"ours {m} fixed", "ours", m, T, TB, ngram=DEFAULTS.get(m, ()), policy="fixed"))
        if m == "ngram-mod":
            cfgs.append(Config(f"ours {m} fresh", "ours", m, T, TB, ngram=DEFAULTS[m], fresh=True))
    if args.threads_compare or args.load:
        cfgs.append(Config("ours plain t1", "ours", "", 1, 1))
    if args.load or args.threads_compare:
        # What the thread governor buys (busy neighbour) or costs (quiet) against fixed threads.
        cfgs.append(Config("ours plain no-governor", "ours", "", T, TB, adaptive=False))
    for label, env in env_variants(args):
        cfgs.append(Config(f"ours plain [{label}]", "ours", "", T, TB, env=env))
        if "ngram-mod" in methods:
            cfgs.append(Config(f"ours ngram-mod [{label}]", "ours", "ngram-mod", T, TB,
                               ngram=DEFAULTS["ngram-mod"], env=env))
    if not args.no_native:
        cfgs.append(Config("native plain", "native", ""))
        cfgs.append(Config("native plain =", "native", "", **equal))
        for m in ("ngram-mod", "ngram-simple", "draft-simple"):
            if m not in methods:
                continue
            # The same drafting parameters as ours, at native's defaults otherwise.
            cfgs.append(Config(f"native {m}", "native", m, ngram=DEFAULTS.get(m, ())))
            cfgs.append(Config(f"native {m} =", "native", m, ngram=DEFAULTS.get(m, ()), **equal))
            if m == "ngram-mod":
                cfgs.append(Config(f"native {m} fresh", "native", m, ngram=DEFAULTS[m], fresh=True))
                # What a user gets from `llama-server --spec-type ngram-mod` (24/48/64).
                cfgs.append(Config(f"native {m} own", "native", m, ngram=(24, 48, 64)))
        if args.threads_compare:
            cfgs.append(Config("native plain t1", "native", "", 1, TB or physical_cores()))
    return cfgs


# ---------------------------------------------------------------------------------
# Worker side (runs in a subprocess per configuration)

class OursHandler:
    """A geniex Session loaded with this configuration, answering as the CLI does."""

    def __init__(self, cfg, model_path):
        from geniex.engine import loop
        from geniex.engine.session import LoadOptions, Session
        from geniex.speculative.options import SpecOptions
        if cfg.plain:
            spec = SpecOptions()
        elif cfg.spec == "draft-simple":
            spec = SpecOptions(types=("draft-simple",), draft_model="demo", draft_path=model_path,
                               n_max=cfg.draft_tokens, policy=cfg.policy)
        else:
            n, lo, hi = cfg.ngram
            spec = SpecOptions(types=(cfg.spec,), ngram_n=n, ngram_min=lo, ngram_max=hi, policy=cfg.policy)
        opts = LoadOptions(nctx=NCTX, threads=cfg.threads, threads_batch=cfg.threads_batch, spec=spec)
        if cfg.ubatch:
            opts.n_ubatch = cfg.ubatch
        opts.adaptive_threads = cfg.adaptive
        if cfg.cache:
            opts.cache_type_k = opts.cache_type_v = cfg.cache
        self.fresh = cfg.fresh
        self.s = Session(model_path, opts)
        if not cfg.plain and self.s.drafter is None:
            raise SystemExit(f"{cfg.name}: speculative setup failed: {self.s.spec_notes}")
        self.model_bytes = self.s.model.size_bytes
        # Time inside the target's llama_decode during verify steps (not the prefill).
        self.in_lib = 0.0
        self.counting = True
        ctx_decode, orig_prefill = self.s.ctx.decode, loop.prefill

        def decode(batch):
            t = time.perf_counter()
            try:
                return ctx_decode(batch)
            finally:
                if self.counting:
                    self.in_lib += time.perf_counter() - t

        def prefill(*a, **k):
            self.counting = False
            try:
                return orig_prefill(*a, **k)
            finally:
                self.counting = True
        self.s.ctx.decode = decode
        loop.prefill = prefill

    def tokenize(self, text):
        from geniex.engine.chat import template_for
        messages = text if isinstance(text, list) else [{"role": "user", "content": text}]
        return self.s.tokenize_prompt(template_for(self.s.model).render(messages))

    def run(self, tokens, n):
        from geniex.engine.loop import GenOptions
        from geniex.engine.sampling import SamplingParams
        self.in_lib = 0.0
        if self.fresh:
            self.s.reset(drafts=True)
        gen = self.s.generate(tokens, GenOptions(max_tokens=n, sampling=SamplingParams(seed=1)))
        for _ in gen:
            pass
        st = gen.stats
        return Run(list(gen.tokens), gen.text, st.decode_speed, st.decode_tokens, st.decode_time,
                   st.steps, st.drafted, st.accepted, list(st.accept_hist), st.draft_time, self.in_lib)

    def trace(self, tokens, n):
        """The plain answer as the loop sampled it (with its end token, if any)."""
        from geniex.engine.loop import GenOptions
        from geniex.engine.sampling import SamplingParams
        gen = self.s.generate(tokens, GenOptions(max_tokens=n, sampling=SamplingParams(seed=1)))
        targets = [t for step in gen for t in step.target]
        return {"targets": targets, "stop": gen.stats.stop_reason}

    def vocab(self):
        return [self.s.vocab.n_tokens, sorted(self.s.vocab.eog)]

    def row_cost(self, ks=ROW_KS, reps=2):
        """Seconds per decode of k rows (logits on every row) after a 100-token prefix."""
        s = self.s
        ctx, b = s.ctx, s.batch
        s.reset()
        ctx.decode(b.fill(list(range(1000, 1100)), 0))
        out = {}
        for k in ks:
            t = time.perf_counter()
            for _ in range(reps):
                ctx.decode(b.fill(list(range(2000, 2000 + k)), 100, all_logits=True))
                ctx.trim(100)
            out[k] = (time.perf_counter() - t) / reps
        s.reset()
        return out


_SPEC_TYPES = {"ngram-mod": "COMMON_SPECULATIVE_TYPE_NGRAM_MOD",
               "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
               "draft-simple": "COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE"}


class NativeHandler:
    """llama.cpp's own server loop, in-process in this worker, via xllamacpp."""

    def __init__(self, cfg, model_path):
        import xllamacpp as x
        p = x.CommonParams()
        p.model.path = str(model_path)
        p.n_ctx = NCTX
        p.n_parallel = 1
        if cfg.threads:                       # else the server's default (its own choice of cores)
            p.cpuparams.n_threads = cfg.threads
            p.cpuparams_batch.n_threads = cfg.threads_batch or cfg.threads
        if cfg.ubatch:                        # else the server's default (512)
            p.n_ubatch = cfg.ubatch
        if cfg.cache:                         # else the server's default (f16)
            p.cache_type_k = p.cache_type_v = getattr(x.ggml_type, "GGML_TYPE_" + cfg.cache.upper())
        p.hostnames = ["127.0.0.1"]           # its HTTP listener: loopback only
        p.port = 0
        if cfg.spec:
            sp = p.speculative
            sp.types = [getattr(x.common_speculative_type, _SPEC_TYPES[cfg.spec])]
            if cfg.spec == "ngram-mod":
                sp.ngram_mod.n_match, sp.ngram_mod.n_min, sp.ngram_mod.n_max = cfg.ngram
            elif cfg.spec == "ngram-simple":
                n, _lo, hi = cfg.ngram
                sp.ngram_simple.size_n, sp.ngram_simple.size_m, sp.ngram_simple.min_hits = n, hi, 1
            else:
                sp.draft.mparams.path = str(model_path)
                sp.draft.n_max, sp.draft.n_min, sp.draft.p_min = cfg.draft_tokens, 0, 0.0
                if cfg.threads:
                    sp.draft.cpuparams.n_threads = cfg.threads
                    sp.draft.cpuparams_batch.n_threads = cfg.threads_batch or cfg.threads
        self.server = x.Server(p)
        self.address = self.server.listening_address
        self.server.handle_completions({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})

    def run(self, tokens, n):
        r = self.server.handle_completions({"prompt": tokens, "max_tokens": n, "temperature": 0.0,
                                            "cache_prompt": True, "stream": False})
        if "choices" not in r:
            raise SystemExit(f"native server error: {r}")
        t = r.get("timings", {})
        return Run([], r["choices"][0]["text"], t.get("predicted_per_second", 0.0),
                   t.get("predicted_n", 0), t.get("predicted_ms", 0.0) / 1000,
                   drafted=t.get("draft_n", 0), accepted=t.get("draft_n_accepted", 0))


def worker(cfg_json):
    body = json.loads(cfg_json)
    cfg = Config(**{k: v for k, v in body["cfg"].items()})
    cfg.ngram = tuple(cfg.ngram)
    handler = (NativeHandler if cfg.side == "native" else OursHandler)(cfg, body["model"])
    print(json.dumps({"ready": True, "address": getattr(handler, "address", ""),
                      "model_bytes": getattr(handler, "model_bytes", 0)}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req.get("cmd", "run")
        if cmd == "tokenize":
            out = handler.tokenize(req["text"])
        elif cmd == "row_cost":
            out = handler.row_cost(req.get("ks", ROW_KS))
        elif cmd == "trace":
            out = handler.trace(req["prompt"], req["n"])
        elif cmd == "vocab":
            out = handler.vocab()
        else:
            out = asdict(handler.run(req["prompt"], req["n"]))
        print(json.dumps(out), flush=True)


class Worker:
    """The bench's handle on one configuration's worker process."""

    def __init__(self, cfg, model_path, logdir):
        self.cfg = cfg
        self.log = open(Path(logdir) / (cfg.name.replace(" ", "_").replace("/", "") + ".log"), "a")
        env = dict(os.environ, GGML_NO_BACKTRACE="1", **cfg.env)
        body = json.dumps({"cfg": asdict(cfg), "model": str(model_path)})
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", body],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     text=True, env=env, cwd=str(ROOT))
        self.address = ""
        self.model_bytes = 0
        self.used = False

    def wait_ready(self):
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.cfg.name}: the worker did not start (see {self.log.name})")
        hello = json.loads(line)
        self.address, self.model_bytes = hello["address"], hello["model_bytes"]

    def ask(self, req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.cfg.name}: the worker died (see {self.log.name})")
        return json.loads(line)

    def run(self, tokens, n):
        return Run(**self.ask({"prompt": tokens, "n": n}))

    def close(self):
        from local_server import stop_process
        stop_process(self.proc)
        self.log.close()


# ---------------------------------------------------------------------------------
# Report helpers

def med(xs):
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else float("nan")


def table(headers, rows):
    widths = [max([len(str(h))] + [len(str(r[i])) for r in rows]) for i, h in enumerate(headers)]
    out = ["| " + " | ".join(str(h).ljust(w) for h, w in zip(headers, widths)) + " |",
           "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |")
    return "\n".join(out)


def f1(x):
    return "-" if x != x else f"{x:.1f}"


def f2(x):
    return "-" if x != x else f"{x:.2f}"


def pct(a, b):
    return f"{a / b:.0%}" if b else "-"


def add_hist(a, b):
    out = list(a) + [0] * max(0, len(b) - len(a))
    for i, v in enumerate(b):
        out[i] += v
    return out


# ---------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=None, help="answer tokens per run (default 128; quick 32)")
    ap.add_argument("--rounds", type=int, default=None, help="alternated rounds (default 3; quick 2)")
    ap.add_argument("--threads", type=int, default=0,
                    help="ours' threads for one-row decodes (default 0: geniex's default, every physical core)")
    ap.add_argument("--threads-batch", type=int, default=0, help="ours' threads for batches (default 0: every physical core)")
    ap.add_argument("--quick", action="store_true",
                    help="ngram-mod only, 32 tokens, 2 rounds, no thread comparison (~1 minute)")
    ap.add_argument("--methods", type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
                    help="comma list of drafting methods, or 'none' (default: every n-gram method and draft-simple)")
    ap.add_argument("--prompts", type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
                    help="comma list of prompts: " + ", ".join(PROMPTS))
    ap.add_argument("--no-native", action="store_true", help="skip llama.cpp's own loop")
    ap.add_argument("--no-threads", action="store_true", help="skip the 1-vs-2-thread comparison")
    ap.add_argument("--passive", action="store_true",
                    help="also run plain, ngram-mod (and the thread comparison) with OMP_WAIT_POLICY=PASSIVE")
    ap.add_argument("--env", action="append", metavar="KEY=VALUE",
                    help="like --passive with another environment setting, e.g. GOMP_SPINCOUNT=10000 (repeatable)")
    ap.add_argument("--load", type=int, default=0, metavar="N",
                    help="run N busy-looping processes during the rounds: a reproducible busy neighbour")
    ap.add_argument("--no-row-cost", action="store_true", help="skip the verify-batch cost table")
    ap.add_argument("--markdown", metavar="FILE", help="also write the report (markdown) to FILE")
    ap.add_argument("--plot", metavar="PNG", help="also draw tok/s by workload and configuration (needs matplotlib)")
    ap.add_argument("--json", help="also write the raw runs to this file")
    ap.add_argument("--replot", metavar="JSON", help="draw --plot from a --json file of an earlier run, then exit")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker)
    if args.replot:
        return replot(args.replot, args.plot or "bench.png")
    args.tokens = args.tokens or (32 if args.quick else 128)
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.threads_compare = not (args.no_threads or args.quick)
    prompts = args.prompts or list(PROMPTS)
    unknown = [p for p in prompts if p not in PROMPTS]
    if unknown:
        raise SystemExit(f"unknown prompt {unknown}; known: {', '.join(PROMPTS)}")

    from geniex.store.demo import INSTALL_HINT, demo_model_path
    path = demo_model_path()
    if path is None:
        raise SystemExit(f"the demo model is not installed: {INSTALL_HINT}")

    t_start = time.perf_counter()
    load0 = os.getloadavg()
    cfgs = make_configs(args)
    logdir = tempfile.mkdtemp(prefix="geniex-bench-")
    workers = {}
    burners = []
    try:
        for c in cfgs:                       # start all, then wait: loads overlap
            workers[c.name] = Worker(c, path, logdir)
        for w in workers.values():
            w.wait_ready()
        plain = workers["ours plain"]
        model_bytes = plain.model_bytes
        toks = {p: plain.ask({"cmd": "tokenize", "text": PROMPTS[p]}) for p in prompts if PROMPTS[p]}
        if "chat-quote" in prompts:
            first = plain.ask({"cmd": "tokenize", "text": PROMPTS["prose"]})
            story = plain.run(first, args.tokens).text
            toks["chat-quote"] = plain.ask({"cmd": "tokenize", "text": [
                {"role": "user", "content": PROMPTS["prose"]}, {"role": "assistant", "content": story},
                {"role": "user", "content": CHAT_QUOTE_ASK}]})
        addrs = sorted({w.address for w in workers.values() if w.address})
        print(f"# geniex bench: {path.name}, {model_bytes / 1e6:.1f} MB, {args.tokens} tokens, "
              f"{args.rounds} rounds, ours' threads {args.threads or 'default'} (batch {args.threads_batch or 'default'}), "
              f"{os.cpu_count()} CPUs, load average {load0[0]:.2f}; loaded in {time.perf_counter() - t_start:.0f} s")
        if addrs:
            print(f"# native servers listen on {', '.join(addrs)}")
        print(f"# worker logs: {logdir}")
        print("# prompts: " + ", ".join(f"{p} ({len(toks[p])} tokens)" for p in prompts), flush=True)

        for _ in range(args.load):
            burners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        if burners:
            print(f"# {len(burners)} busy-looping process(es) running during the rounds (--load)")
        runs = {(c.name, p): [] for c in cfgs for p in prompts}
        cost_workers = [] if args.no_row_cost else [workers["ours plain"]]
        costs = {w.cfg.name: [] for w in cost_workers}
        for r in range(args.rounds):
            t_round = time.perf_counter()
            for pi, p in enumerate(prompts):
                shift = (r * len(prompts) + pi) % len(cfgs)
                order = cfgs[shift:] + cfgs[:shift]
                if r % 2:
                    order = order[::-1]
                for c in order:
                    w = workers[c.name]
                    if c.fresh and c.side == "native" and w.used:
                        w.close()
                        w = workers[c.name] = Worker(c, path, logdir)
                        w.wait_ready()
                    runs[(c.name, p)].append(w.run(toks[p], args.tokens))
                    w.used = True
            for w in (cost_workers if r % 2 == 0 else cost_workers[::-1]):
                costs[w.cfg.name].append({int(k): v for k, v in w.ask({"cmd": "row_cost"}).items()})
            print(f"# round {r + 1}/{args.rounds}: {time.perf_counter() - t_round:.1f} s, "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        for w in workers.values():
            w.close()

    buf = io.StringIO()
    with contextlib.redirect_stdout(Tee(sys.stdout, buf)):
        report(args, cfgs, prompts, runs, model_bytes, costs)
    if args.markdown:
        Path(args.markdown).write_text(f"# tools/bench/bench.py {' '.join(sys.argv[1:])}\n{buf.getvalue()}",
                                       encoding="utf-8")
    if args.plot:
        plot(args.plot, cfgs, prompts, runs, args.rounds)
    if args.json:
        with open(args.json, "w") as fp:
            json.dump({"args": vars(args), "prompts": toks, "costs": costs,
                       "runs": {f"{k[0]}|{k[1]}": [asdict(x) for x in v] for k, v in runs.items()}}, fp)
    load1 = os.getloadavg()
    print(f"\n# done in {time.perf_counter() - t_start:.0f} s; load average {load0[0]:.2f} -> {load1[0]:.2f}")


def replot(path, png):
    """--plot from a --json file (the configurations in the order they ran)."""
    data = json.loads(Path(path).read_text())
    runs, names, prompts = {}, [], []
    for key, items in data["runs"].items():
        name, prompt = key.split("|")
        runs[(name, prompt)] = [Run(**x) for x in items]
        names += [name] if name not in names else []
        prompts += [prompt] if prompt not in prompts else []
    plot(png, [Config(n, n.split()[0]) for n in names], prompts, runs, data["args"]["rounds"])
    print(f"wrote {png}")


class Tee:
    """Write to several streams (the report goes to the terminal and to --markdown)."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for st in self.streams:
            st.write(text)

    def flush(self):
        for st in self.streams:
            st.flush()


def plot(path, cfgs, prompts, runs, rounds):
    """A bar chart of median tok/s per workload and configuration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [c.name for c in cfgs if not c.env]
    fig, ax = plt.subplots(figsize=(16, 6))
    width = 0.85 / len(names)
    colors = plt.get_cmap("tab20").colors + plt.get_cmap("tab20b").colors
    for i, name in enumerate(names):
        ys = [med([runs[(name, p)][r].tok_s for r in range(rounds)]) for p in prompts]
        ax.bar([j + i * width for j in range(len(prompts))], ys, width, label=name,
               color=colors[i % len(colors)], hatch="//" if name.startswith("native") else None)
    ax.set_xticks([j + 0.425 - width / 2 for j in range(len(prompts))], prompts)
    ax.set_ylabel("tok/s (median over rounds)")
    ax.set_title("geniex (plain bars) vs llama.cpp's server (hatched), demo model, greedy")
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(args, cfgs, prompts, runs, model_bytes, costs):
    R = args.rounds
    by = {c.name: c for c in cfgs}

    def round_speed(name, r, ps=None):
        """tok/s of one config in round r over prompts ps (tokens / decode time)."""
        ps = ps or prompts
        n = sum(runs[(name, p)][r].n for p in ps)
        t = sum(runs[(name, p)][r].decode_s for p in ps)
        return n / t if t > 0 else float("nan")

    def speed(name, p=None):
        return med([round_speed(name, r, [p] if p else None) for r in range(R)])

    def ratio(a, b, p=None):
        if a not in by or b not in by:
            return float("nan")
        ps = [p] if p else None
        return med([round_speed(a, r, ps) / round_speed(b, r, ps) for r in range(R)])

    print("\n## Decode speed (tok/s, median over rounds; 'all' = answer tokens / decode time over all prompts)\n")
    rows = [[c.name] + [f1(speed(c.name, p)) for p in prompts]
            + [f1(speed(c.name)), f2(model_bytes * speed(c.name) / 1e9)] for c in cfgs]
    print(table(["config"] + prompts + ["all", "GB/s"], rows))
    print("\nGB/s = bandwidth achieved: model bytes x tok/s (for speculative rows: committed tokens/s).")

    print("\n## Ratios measured in this run (median of per-round paired ratios; geo = geometric "
          "mean over the workloads)\n")
    rows = []

    def add(a, b, label=None):
        if a in by and b in by:
            per = [ratio(a, b, p) for p in prompts]
            geo = math.exp(sum(math.log(x) for x in per) / len(per)) if all(x > 0 for x in per) else float("nan")
            rows.append([label or f"{a} / {b}"] + [f2(x) for x in per] + [f2(ratio(a, b)), f2(geo)])
    add("ours plain", "native plain", "ours plain / native plain (each at its defaults)")
    add("ours plain", "native plain =", "ours plain / native plain = (equal settings)")
    for c in cfgs:
        if c.side == "ours" and not c.plain and not c.env:
            add(c.name, "ours plain")
    for m in ("ngram-mod", "ngram-simple", "draft-simple"):
        add(f"ours {m}", f"native {m}", f"ours {m} / native {m} (defaults, same drafting parameters)")
        add(f"ours {m} fixed", f"native {m} =", f"ours {m} fixed / native {m} = (equal settings)")
        add(f"native {m}", "native plain")
    add("ours ngram-mod", "native ngram-mod own", "ours ngram-mod / native ngram-mod own (each at its defaults)")
    add("ours ngram-mod fresh", "native ngram-mod fresh", "ours ngram-mod fresh / native ngram-mod fresh")
    add("ours plain t1", "ours plain", "ours plain t1 / all cores")
    add("ours plain", "ours plain t1", "ours plain (governor) / t1")
    add("ours plain", "ours plain no-governor", "ours plain (governor) / no governor")
    add("native plain t1", "native plain", "native plain t1 / its default")
    for label, _env in env_variants(args):
        add(f"ours plain [{label}]", "ours plain", f"ours plain: [{label}] / default")
        add(f"ours ngram-mod [{label}]", "ours ngram-mod", f"ours ngram-mod: [{label}] / default")
    print(table(["ratio"] + prompts + ["all", "geo"], rows))
    print("\n'=': native at ours' settings (all cores, micro-batch 32, q8_0 KV cache). 'fresh': drafting "
          "memory forgotten before every run (native: a new server). 'own': native's own n-gram defaults "
          "(24/48/64). Without 'fresh', both sides keep what drafting learned across requests, as their "
          "servers do; every workload runs every round.")

    print("\n## Drafting (summed over prompts and rounds)\n")
    rows = []
    for c in cfgs:
        if c.plain:
            continue
        allr = [x for p in prompts for x in runs[(c.name, p)]]
        drafted, acc = sum(x.drafted for x in allr), sum(x.accepted for x in allr)
        n, steps = sum(x.n for x in allr), sum(x.steps for x in allr)
        hist = []
        for x in allr:
            hist = add_hist(hist, x.hist)
        per_prompt = " ".join(f"{p} {pct(sum(x.accepted for x in runs[(c.name, p)]), sum(x.drafted for x in runs[(c.name, p)]))}"
                              for p in prompts)
        params = f"n={c.ngram[0]} min={c.ngram[1]} max={c.ngram[2]}" if c.ngram else f"draft-tokens={c.draft_tokens}"
        drafting_steps = sum(hist)
        rows.append([c.name, params, drafted, pct(acc, drafted), per_prompt,
                     f"{drafting_steps}/{steps}" if c.side == "ours" else "-",
                     f2(n / steps) if steps else "-", " ".join(map(str, hist)) or "-",
                     f2(1000 * sum(x.draft_s for x in allr) / steps) if steps else "-"])
    print(table(["config", "params", "drafted", "accepted", "accepted per prompt", "steps drafting",
                 "tokens/step", "accepted-length histogram 0,1,2,..", "draft ms/step"], rows))
    print("\nHistogram: drafting steps by how many drafts the target accepted. Native reports drafted and "
          "accepted only.")

    print("\n## Output identity (every round against the first 'ours plain' run)\n")
    rows = []
    for c in cfgs:
        cells = []
        for p in prompts:
            ref = runs[("ours plain", p)][0]
            if c.side == "ours":
                same = all(x.tokens == ref.tokens for x in runs[(c.name, p)])
                cells.append("tokens equal" if same else "TOKENS DIFFER")
            else:
                same = all(x.text == ref.text for x in runs[(c.name, p)])
                cells.append("text equal" if same else "text differs")
        rows.append([c.name] + cells)
    print(table(["config"] + prompts, rows))
    print("\nOurs compare token ids; native compares text (its server returns text).")

    print("\n## Our loop's time per verify step\n")
    rows = []
    for c in cfgs:
        if c.side != "ours":
            continue
        allr = [x for p in prompts for x in runs[(c.name, p)]]
        steps = sum(x.steps for x in allr)
        dec, lib, dr = (sum(x.decode_s for x in allr), sum(x.in_lib_s for x in allr),
                        sum(x.draft_s for x in allr))
        if steps:
            rows.append([c.name, steps, f2(1000 * dec / steps), f2(1000 * lib / steps), f2(1000 * dr / steps),
                         f"{1e6 * (dec - lib - dr) / steps:.0f}", f"{(dec - lib - dr) / dec:.1%}"])
    print(table(["config", "steps", "wall ms", "target llama_decode ms", "drafter ms",
                 "rest us", "rest share"], rows))
    print("\nrest = sampling (logits view, argmax), detokenizing, stop checks, bookkeeping, generator.")

    for name, per_round in costs.items():
        if not per_round:
            continue
        c = by[name]
        mid = {k: med([d[k] for d in per_round]) for k in ROW_KS}
        low = {k: min(d[k] for d in per_round) for k in ROW_KS}
        print(f"\n## Verify-batch cost, {name} (threads {c.threads}, batch threads {c.threads_batch}; "
              f"one measurement per round: median and fastest)\n")
        print(table(["rows", "median ms", "x one row", "fastest ms", "x one row "],
                    [[k, f2(1000 * mid[k]), f2(mid[k] / mid[1]), f2(1000 * low[k]), f2(low[k] / low[1])]
                     for k in ROW_KS]))
        if low[2] > 3 * low[1]:
            print(f"\nWARNING: even the fastest 2-row batch cost {low[2] / low[1]:.0f}x a one-row decode: "
                  "multi-threaded batches stall (another process holds a core while OpenMP threads spin-wait). "
                  "Compare the [passive] rows (--passive) or rerun with --threads-batch 1.")


if __name__ == "__main__":
    sys.exit(main())
