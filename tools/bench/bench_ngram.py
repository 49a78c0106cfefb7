#!/usr/bin/env python3
"""Choose n-gram drafting parameters by measurement on the demo model.

    python tools/bench/bench_ngram.py [--tokens N] [--rounds R] [--methods ...] [--no-timing]

Grid: match length n in {2,3,4,6,8,12,24}, minimum draft in {1,2,4,48}, maximum draft
in {8,16,64} (combinations with min > max are skipped), for every n-gram method, on
code-edit and quoting prompts (and open prose as a control: drafts there are mostly
wasted rows).

Two stages:

1. Replay (exact, no timing): the demo model answers each prompt once, plainly. Because
   speculative output equals plain output token for token (tools/bench/bench.py checks it on
   every run), the drafts and acceptances of any parameter set are fully determined by
   that answer. The replay runs the real loop (``geniex.engine.loop.steps``) and the
   real drafters against a stand-in context whose logits are one-hot on the plain
   answer, so every grid point costs milliseconds. Reported: drafts made, steps that
   drafted, acceptance, tokens per verify step, and a predicted speed ratio from the
   verify-batch cost curve measured in the same run.
2. Timing (real): a shortlist (upstream's 24/48/64, the current DEFAULTS, and the best
   of the replay) runs on the real model in worker processes, alternated round by
   round against plain decoding; tok/s ratio vs plain, median of per-round ratios. Each
   real run's drafted/accepted counts are checked against the replay's.
"""
import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (tools/bench/bench.py: prompts, workers, table helpers)

from geniex.engine.loop import GenOptions  # noqa: E402
from geniex.engine.sampling import SamplingParams  # noqa: E402
from geniex.speculative.drafters import ngram  # noqa: E402
from geniex.speculative.options import NGRAM_DEFAULTS  # noqa: E402

NS = (2, 3, 4, 6, 8, 12, 24)
MINS = (1, 2, 4, 48)
MAXS = (8, 16, 64)
COST_KS = (1, 2, 4, 8, 16, 32, 64)
UPSTREAM = (24, 48, 64)

# Code edits whose answer repeats most of the input, quoting tasks, and prose controls.
CONFIG = """server:
  host: 0.0.0.0
  port: 5000
  workers: 4
logging:
  level: info
  file: /var/log/app.log
database:
  url: postgres://localhost/app
  pool_size: 10
"""

FUNC = '''def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, age = line.strip().split(",")
            users.append({"name": name, "age": int(age)})
    return users
'''

LIST = """- buy milk
- call the plumber about the kitchen sink
- send the quarterly report to Anna
- book train tickets for Friday
- water the plants on the balcony"""

EMAIL = ("Hi team, the release is moved to Thursday because the payment tests are still failing. "
         "Please do not merge anything into the main branch until Wednesday evening. "
         "If you need an exception, ask Maria before noon. Thanks, Tom")

PROMPTS = {
    "code-rename": ("code-edit", bench.PROMPTS["code-edit"]),
    "code-config": ("code-edit", "Change the port to 8080 and the log level to debug in this YAML file. "
                    "Reply with the whole updated file.\n\n```yaml\n" + CONFIG + "```"),
    "code-hints": ("code-edit", "Add type hints to this Python function and return the complete "
                   "function.\n\n```python\n" + FUNC + "```"),
    "quote-passage": ("quote", bench.PROMPTS["quote"]),
    "quote-list": ("quote", "Repeat this list exactly, then add one more item at the end.\n\n" + LIST),
    "quote-email": ("quote", "Quote the sentence of this email that says what not to do, word for word, "
                    "then summarize the email in one sentence.\n\n" + EMAIL),
    "prose-story": ("prose", bench.PROMPTS["prose"]),
    "prose-explain": ("prose", "Explain why the sky is blue to a ten-year-old."),
}


# ---------------------------------------------------------------------------------
# Replay: the real loop and drafters against a context that follows the plain answer

def replay(prompt, answer, n_tokens, n_vocab, eog, method, n, lo, hi):
    """Stats and per-step row counts of one method/parameter set on one answer."""
    from geniex.speculative.options import SpecOptions
    from geniex.engine.stats import Stats
    from replay import ReplayTarget
    target = ReplayTarget(list(prompt) + list(answer), n_vocab, eog, n_ctx=bench.NCTX)
    drafter = ngram.make(method, SpecOptions(types=(method,), ngram_n=n, ngram_min=lo, ngram_max=hi))
    opts = GenOptions(max_tokens=n_tokens, sampling=SamplingParams(seed=1))
    stats = Stats()
    rows, committed = [], []
    for step in target.steps(prompt, opts, drafter, None, stats):
        rows.append(len(step.drafted) + 1)
        committed.extend(step.committed)
    return stats, rows, committed


# ---------------------------------------------------------------------------------

def cost_of(rows, cost):
    """Relative cost of a verify batch of ``rows`` rows (interpolated from the curve)."""
    ks = sorted(cost)
    if rows in cost:
        return cost[rows]
    lo = max(k for k in ks if k <= rows) if rows >= ks[0] else ks[0]
    hi = min((k for k in ks if k >= rows), default=ks[-1])
    if hi == lo:
        return cost[lo] * rows / lo
    return cost[lo] + (cost[hi] - cost[lo]) * (rows - lo) / (hi - lo)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=160, help="answer tokens per prompt (default 160)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated rounds of the timed shortlist (default 3)")
    ap.add_argument("--methods", type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
                    default=list(ngram.CLASSES), help="comma list (default: every n-gram method)")
    ap.add_argument("--threads", type=int, default=1, help="threads for one-row decodes (default 1)")
    ap.add_argument("--threads-batch", type=int, default=0, help="threads for batches (default: physical cores)")
    ap.add_argument("--shortlist", type=int, default=3,
                    help="best predicted replay points per method to time (default 3)")
    ap.add_argument("--tps-points", type=int, default=1,
                    help="best tokens/step replay points per method to time as well (default 1)")
    ap.add_argument("--timed-methods", type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
                    default=["ngram-mod", "ngram-simple"], help="methods whose shortlist is timed")
    ap.add_argument("--no-timing", action="store_true", help="replay only")
    ap.add_argument("--cost-repeats", type=int, default=5, help="verify-cost measurements; the fastest counts")
    ap.add_argument("--passive", action="store_true",
                    help="run the workers with OMP_WAIT_POLICY=PASSIVE (steadier timings on a busy machine)")
    args = ap.parse_args(argv)

    from geniex.store.demo import INSTALL_HINT, demo_model_path
    path = demo_model_path()
    if path is None:
        raise SystemExit(f"the demo model is not installed: {INSTALL_HINT}")
    t_start = time.perf_counter()
    tb = args.threads_batch or bench.physical_cores()
    logdir = tempfile.mkdtemp(prefix="geniex-bench-ngram-")
    print(f"# geniex bench_ngram: {path.name}, {args.tokens} tokens, threads {args.threads} (batch {tb}), "
          f"{'OMP_WAIT_POLICY=PASSIVE, ' if args.passive else ''}load average {os.getloadavg()[0]:.2f}; "
          f"worker logs {logdir}")

    # 1. Plain answers, the verify-cost curve (one worker: the real model, plain).
    env = {"OMP_WAIT_POLICY": "PASSIVE"} if args.passive else {}
    plain_cfg = bench.Config("ours plain", "ours", "", args.threads, tb, env=env)
    plain = bench.Worker(plain_cfg, path, logdir)
    plain.wait_ready()
    toks, answers, eog_seen = {}, {}, set()
    try:
        for name, (_kind, text) in PROMPTS.items():
            toks[name] = plain.ask({"cmd": "tokenize", "text": text})
            run = plain.ask({"cmd": "trace", "prompt": toks[name], "n": args.tokens})
            answers[name] = run["targets"]
            if run["stop"] == "eos":
                eog_seen.add(run["targets"][-1])
        # The least disturbed of several measurements: a busy machine only adds time.
        curves = [plain.ask({"cmd": "row_cost", "ks": list(COST_KS)}) for _ in range(args.cost_repeats)]
        n_vocab, eog = plain.ask({"cmd": "vocab"})
    finally:
        plain.close()
    cost = {int(k): min(c[k] for c in curves) for k in curves[0]}
    rel = {k: v / cost[1] for k, v in cost.items()}
    eog = frozenset(eog)
    print("\n## Plain answers\n")
    print(bench.table(["prompt", "kind", "prompt tokens", "answer tokens", "ends"],
                      [[p, PROMPTS[p][0], len(toks[p]), len(answers[p]),
                        "eos" if answers[p] and answers[p][-1] in eog else "length"] for p in PROMPTS]))
    print(f"\n## Verify-batch cost on this machine (fastest of {args.cost_repeats}; relative to one row "
          f"= {1000 * cost[1]:.1f} ms)\n")
    print(bench.table(["rows"] + [str(k) for k in COST_KS], [["x one row"] + [f"{rel[k]:.2f}" for k in COST_KS]]))
    if rel[2] > 3:
        print(f"\nWARNING: a 2-row batch cost {rel[2]:.0f}x a one-row decode: multi-threaded batches are stalling "
              "(another process holds a core and OpenMP threads spin-wait). Predicted and timed ratios of this "
              "run say more about the stalls than about drafting; rerun with --passive or --threads-batch 1.")

    # 2. Replay the whole grid.
    grid = [(n, lo, hi) for n, lo, hi in itertools.product(NS, MINS, MAXS) if lo <= hi]
    results = {}      # (method, params) -> {prompt: (stats, rows)}
    t0 = time.perf_counter()
    for method in args.methods:
        for params in grid:
            per = {}
            for p in PROMPTS:
                stats, rows, committed = replay(toks[p], answers[p], args.tokens, n_vocab, eog, method, *params)
                plain_committed = [t for t in answers[p] if t not in eog]
                if committed != plain_committed:
                    raise SystemExit(f"replay of {method} {params} on {p} changed the answer (a loop bug)")
                per[p] = (stats, rows)
            results[(method, params)] = per
    print(f"\n# replayed {len(results)} method/parameter sets x {len(PROMPTS)} prompts in "
          f"{time.perf_counter() - t0:.1f} s")

    target = [p for p in PROMPTS if PROMPTS[p][0] != "prose"]
    prose = [p for p in PROMPTS if PROMPTS[p][0] == "prose"]

    def summary(method, params, ps):
        per = results[(method, params)]
        steps = sum(per[p][0].steps for p in ps)
        tokens = sum(per[p][0].decode_tokens for p in ps)
        drafted = sum(per[p][0].drafted for p in ps)
        accepted = sum(per[p][0].accepted for p in ps)
        firing = sum(sum(per[p][0].accept_hist) for p in ps)
        work = sum(cost_of(r, rel) for p in ps for r in per[p][1])
        # tokens per step = speedup if a verify batch cost one row (bandwidth-bound device);
        # predicted = speedup with this machine's measured cost curve.
        return {"steps": steps, "tokens": tokens, "drafted": drafted, "accepted": accepted, "firing": firing,
                "acc": accepted / drafted if drafted else float("nan"),
                "tps": tokens / steps if steps else float("nan"),
                "pred": tokens / work if work else float("nan"),
                "wasted": (drafted - accepted) / tokens * 100 if tokens else 0.0}

    def row(method, params, label=""):
        s, c = summary(method, params, target), summary(method, params, prose)
        per_prompt = " ".join(f"{results[(method, params)][p][0].accepted}/{results[(method, params)][p][0].drafted}"
                              for p in target)
        return [method, "n=%d min=%d max=%d" % params + label, s["firing"], s["drafted"], bench.pct(s["accepted"], s["drafted"]),
                per_prompt, f"{s['tps']:.2f}", f"{s['pred']:.2f}", f"{s['wasted']:.1f}", f"{c['wasted']:.1f}"]

    headers = ["method", "params", "steps drafting", "drafted", "accepted", "accepted/drafted per prompt",
               "tokens/step", "predicted ratio here", "wasted rows /100 tok", "prose: wasted /100 tok"]
    def outcome(method, prm):
        s = summary(method, prm, target)
        return (s["steps"], s["drafted"], s["accepted"])

    def distinct(method, prms):
        """Drop points whose replay outcome equals an earlier point's (e.g. min 1 vs 2)."""
        seen, out = set(), []
        for prm in prms:
            o = outcome(method, prm)
            if o not in seen:
                seen.add(o)
                out.append(prm)
        return out

    best = {}
    for method in args.methods:
        dmin = NGRAM_DEFAULTS[method][1]
        # Among equal scores prefer the current default's minimum draft.
        ranked = distinct(method, sorted(grid, key=lambda prm: (-round(summary(method, prm, target)["tps"], 6),
                                                                 abs(prm[1] - dmin))))
        by_pred = distinct(method, sorted(grid, key=lambda prm: (-round(summary(method, prm, target)["pred"], 6),
                                                                  abs(prm[1] - dmin))))
        best[method] = (ranked, by_pred)
        print(f"\n## {method}: replay on {', '.join(target)} (prose as control; best predicted "
              "ratio first, then best tokens/step; equal outcomes shown once)\n")
        show = []
        for prm in by_pred[:6] + ranked[:4] + [NGRAM_DEFAULTS[method], UPSTREAM]:
            if prm not in show:
                show.append(prm)
        rows = []
        for prm in show:
            label = (" (current default)" if prm == NGRAM_DEFAULTS[method] else "") + \
                    (" (upstream)" if prm == UPSTREAM else "")
            rows.append(row(method, prm, label))
        print(bench.table(headers, rows))

    # Sensitivity of ngram-mod to each parameter (others at the best tokens/step point).
    for method in args.methods:
        top = best[method][1][0]
        print(f"\n## {method}: one parameter at a time around the best predicted n={top[0]} min={top[1]} "
              f"max={top[2]}\n")
        rows, shown = [], set()
        for i, values in enumerate((NS, MINS, MAXS)):
            for v in values:
                prm = list(top)
                prm[i] = v
                prm = tuple(prm)
                if prm[1] <= prm[2] and prm not in shown:
                    shown.add(prm)
                    rows.append(row(method, prm))
        print(bench.table(headers, rows))

    if args.no_timing:
        print(f"\n# done in {time.perf_counter() - t_start:.0f} s")
        return

    # 3. Time a shortlist on the real model.
    cfgs = [bench.Config("ours plain", "ours", "", args.threads, tb, env=env)]
    seen = set()
    for method in args.timed_methods:
        ranked, by_pred = best[method]
        pts = [UPSTREAM, NGRAM_DEFAULTS[method]] + by_pred[:args.shortlist] + ranked[:args.tps_points]
        for prm in pts:
            if (method, prm) not in seen:
                seen.add((method, prm))
                cfgs.append(bench.Config(f"{method} {prm[0]}/{prm[1]}/{prm[2]}", "ours", method,
                                         args.threads, tb, ngram=prm, env=env))
    workers = {}
    runs = {(c.name, p): [] for c in cfgs for p in target}
    try:
        for c in cfgs:
            workers[c.name] = bench.Worker(c, path, logdir)
        for w in workers.values():
            w.wait_ready()
        for r in range(args.rounds):
            t_round = time.perf_counter()
            for pi, p in enumerate(target):
                shift = (r * len(target) + pi) % len(cfgs)
                order = cfgs[shift:] + cfgs[:shift]
                if r % 2:
                    order = order[::-1]
                for c in order:
                    runs[(c.name, p)].append(workers[c.name].run(toks[p], args.tokens))
            print(f"# timed round {r + 1}/{args.rounds}: {time.perf_counter() - t_round:.0f} s, "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        for w in workers.values():
            w.close()

    def round_speed(name, r):
        n = sum(runs[(name, p)][r].n for p in target)
        t = sum(runs[(name, p)][r].decode_s for p in target)
        return n / t

    print(f"\n## Timed on the real model ({len(target)} prompts, {args.rounds} rounds; ratio = median of "
          "per-round ratios)\n")
    rows = []
    for c in cfgs:
        speeds = [round_speed(c.name, r) for r in range(args.rounds)]
        ratios = [round_speed(c.name, r) / round_speed("ours plain", r) for r in range(args.rounds)]
        check = "-"
        if not c.plain:
            ok = all(x.drafted == results[(c.spec, c.ngram)][p][0].drafted
                     and x.accepted == results[(c.spec, c.ngram)][p][0].accepted
                     for p in target for x in runs[(c.name, p)])
            same = all(x.tokens == runs[("ours plain", p)][0].tokens for p in target for x in runs[(c.name, p)])
            check = ("replay matches" if ok else "REPLAY DIFFERS") + (", tokens equal" if same else ", TOKENS DIFFER")
        s = summary(c.spec, c.ngram, target) if not c.plain else None
        rows.append([c.name, f"{statistics.median(speeds):.1f}", f"{statistics.median(ratios):.2f}",
                     " ".join(f"{x:.2f}" for x in ratios),
                     f"{s['tps']:.2f}" if s else "-", f"{s['pred']:.2f}" if s else "-", check])
    print(bench.table(["config (n/min/max)", "tok/s", "ratio vs plain", "per-round ratios", "tokens/step",
                       "predicted ratio", "check"], rows))
    print(f"\n# done in {time.perf_counter() - t_start:.0f} s; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
