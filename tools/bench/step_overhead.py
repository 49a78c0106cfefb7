#!/usr/bin/env python3
"""What a speculative step costs when it verifies no draft, against a plain step.

    python tools/bench/step_overhead.py [--rounds 3] [--workloads short,open-question]
                                        [--method ngram-mod] [--threads 1] [--replay-only]

Two measurements, both on the bench's requests (``workloads/``, in the bench's order,
earlier turns unmeasured):

1. **The loop's own CPU time** (no model): the real loop, drafter and draft policy run
   against a stand-in context that replays each plain answer (:mod:`geniex.engine.replay`,
   as ``counts.py``), once plain and once speculative. Every step's CPU time of this
   thread (``time.thread_time``: what a busy neighbour cannot stretch) is split into the
   drafter's lookup (``propose``), its update (``begin``/``observe``: indexing the
   committed tokens), the draft policy (``cap``/``take``/``observe``) and the rest (batch,
   sampling, commit, stats, the Step record). Printed in microseconds per step, for the
   plain steps and for the speculative steps that verified no draft.
2. **The model** (unless ``--replay-only``): one session of ``--method`` answers every
   request twice, speculative and plain (``Session.generate(speculative=False)``: the same
   context, KV cache and thread setting), alternating which goes first, each from an
   empty KV cache. Each step's time is taken between the loop's consecutive steps, in
   wall-clock and in this thread's CPU time. With ``--threads 1`` (the default) the
   decode runs in this thread, so its CPU time does not move with the machine's load;
   ``--threads 0`` (every core) is what a user runs, and is only as good as the machine
   is quiet. Speculative one-row steps are split by what came before (a one-row step, or
   a verify batch of several rows: the library then builds the one-row graph again) and
   compared with the plain step at the same position; the first steps of an answer are
   shown on their own (set-up on the answer's clock). The thread governor is off (it
   would move decodes between thread counts mid-answer).

The load average before and after is printed with the figures.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402
from counts import CACHE, PlainAnswers, answered_requests, conversation, requests  # noqa: E402
from report import table  # noqa: E402

CURVE = {1: 1.0, 2: 2.0, 4: 2.8, 8: 4.2, 16: 7.9}   # the policy's prices in the replay (no timing)
FIRST = 4             # steps that count as an answer's first
PARTS = ("drafter lookup", "drafter update", "policy")   # timed calls (Clock); the rest is the loop's


class Clock:
    """CPU seconds of this thread per named part, for one step at a time."""

    def __init__(self):
        self.parts = {}

    def timed(self, part, fn):
        def run(*a, **k):
            t = time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                self.parts[part] = self.parts.get(part, 0.0) + time.thread_time() - t
        return run

    def take(self):
        out, self.parts = self.parts, {}
        return out


def _instrument(clock, drafter, policy):
    """Time the drafter's and the policy's calls (instance attributes shadow the methods)."""
    for name, part in (("begin", "drafter update"), ("observe", "drafter update"), ("propose", "drafter lookup")):
        setattr(drafter, name, clock.timed(part, getattr(drafter, name)))
    for name in ("cap", "take", "observe"):
        setattr(policy, name, clock.timed("policy", getattr(policy, name)))


def replay_part(reqs, n_vocab, eog, method):
    """{(mode, part): [microseconds per step]} over every measured request."""
    from geniex.engine.loop import FIXED, GenOptions
    from geniex.engine.replay import ReplayTarget
    from geniex.engine.sampling import SamplingParams
    from geniex.speculative import policy as pol
    from geniex.speculative.drafters import ngram
    from geniex.speculative.options import SpecOptions
    clock = Clock()
    drafter = ngram.make(method, SpecOptions(types=(method,)))
    policy = pol.GainPolicy(CURVE, 0.01)
    _instrument(clock, drafter, policy)
    out = {}
    for wl, prompt, sampled, n, measured in reqs:
        for mode in ("plain", "spec"):
            target = ReplayTarget(list(prompt) + list(sampled), n_vocab, eog)
            gen = target.steps(prompt, GenOptions(max_tokens=n, sampling=SamplingParams(seed=1)),
                               drafter if mode == "spec" else None, None, None,
                               policy if mode == "spec" else FIXED)
            t = time.thread_time()
            clock.take()
            for step in gen:
                now = time.thread_time()
                parts = clock.take()
                if measured and step.index > 0 and not step.drafted:
                    total = (now - t) * 1e6
                    timed = 0.0
                    for part in (PARTS if mode == "spec" else ()):
                        secs = parts.get(part, 0.0) * 1e6      # a part not called this step: 0
                        out.setdefault((mode, part), []).append(secs)
                        timed += secs
                    out.setdefault((mode, "rest of the loop"), []).append(total - timed)
                    out.setdefault((mode, "total"), []).append(total)
                t = time.thread_time()
    return out


def model_part(args, chosen):
    """Per-step times of the real model, plain and speculative on one session."""
    from geniex.engine.chat import template_for
    from geniex.engine.loop import GenOptions
    from geniex.engine.sampling import SamplingParams
    from geniex.engine.session import LoadOptions, Session
    from geniex.speculative.options import SpecOptions
    from geniex.store.demo import demo_model_path
    # A data dir of its own: the policy's verify costs measured now, never read from or
    # left in the user's calibration cache.
    with tempfile.TemporaryDirectory() as data_dir:
        s = Session(demo_model_path(), LoadOptions(nctx=4096, threads=args.threads, threads_batch=args.threads,
                                                   adaptive_threads=False, data_dir=data_dir,
                                                   spec=SpecOptions(types=(args.method,))))
    tpl = template_for(s.model)
    answers_of, rec, i = {}, {}, 0
    ratios, cpu_ratios, verifies = {}, {}, []          # verifies: (rows, position, CPU seconds) of the drafted steps
    for w, r, turns, n, measured in requests(chosen, args.rounds, args.quick):
        earlier = answers_of.get((w.name, r), [])
        prompt = s.tokenize_prompt(tpl.render(conversation(turns, earlier)))
        runs = {}
        for spec in ((True, False) if i % 2 else (False, True)):
            s.reset()
            gen = s.generate(prompt, GenOptions(max_tokens=n, sampling=SamplingParams(seed=1)), speculative=spec)
            steps, tw, tc = [], time.perf_counter(), time.thread_time()
            for step in gen:
                w1, c1 = time.perf_counter(), time.thread_time()
                steps.append((step.n_past, len(step.drafted) + 1, w1 - tw, c1 - tc, step.index))
                tw, tc = w1, c1
            runs[spec] = (steps, gen.tokens, gen.stats.decode_time)
        i += 1
        if runs[True][1] != runs[False][1]:
            print(f"WARNING: {w.name} round {r}: the speculative answer differs from the plain one")
        answers_of[(w.name, r)] = earlier + [gen.text]
        if not measured:
            continue
        ratios.setdefault(w.name, []).append(runs[False][2] / runs[True][2])
        cpu_time = {spec: sum(c for _p, _r, _w, c, idx in runs[spec][0] if idx > 0) for spec in runs}
        cpu_ratios.setdefault(w.name, []).append(cpu_time[False] / cpu_time[True])
        verifies.extend((rows, p, cpu) for p, rows, _wall, cpu, idx in runs[True][0] if rows > 1 and idx > 0)
        plain_at = {p: (wall, cpu) for p, _rows, wall, cpu, idx in runs[False][0] if idx > 0}
        prev_rows = 1
        for p, rows, wall, cpu, idx in runs[True][0]:
            if idx == 0:
                prev_rows = rows
                continue
            if rows > 1:
                kind = f"drafted ({rows} rows)" if rows <= 3 else "drafted (4+ rows)"
            elif idx < FIRST:
                kind = "no draft, answer's first steps"
            elif prev_rows > 1:
                kind = "no draft, after a verify batch"
            else:
                kind = "no draft, after a one-row step"
            prev_rows = rows
            k = rec.setdefault((w.name, kind), {"spec": [], "plain": [], "diff": []})
            k["spec"].append((wall, cpu))
            if p in plain_at and rows == 1:
                k["plain"].append(plain_at[p])
                k["diff"].append((wall - plain_at[p][0], cpu - plain_at[p][1]))
        for p, (wall, cpu) in plain_at.items():
            rec.setdefault((w.name, "plain, every step"), {"spec": [], "plain": [], "diff": []})["plain"].append(
                (wall, cpu))
    curve = [s.policy.verify_cost(k) for k in range(512)] if hasattr(s.policy, "verify_cost") else None
    s.close()
    return rec, (ratios, cpu_ratios), verifies, curve


def med(xs, i):
    return statistics.median(x[i] for x in xs) * 1000 if xs else float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the bench's --quick answer lengths")
    ap.add_argument("--workloads", type=lambda s: [x for x in s.split(",") if x], default=["short", "open-question"])
    ap.add_argument("--method", default="ngram-mod")
    ap.add_argument("--threads", type=int, default=1, help="decode threads (0 = every core; 1: load-free CPU time)")
    ap.add_argument("--replay-only", action="store_true", help="only the loop's own CPU time (no model)")
    ap.add_argument("--cache", type=Path, default=CACHE, help="plain answers cache (counts.py's)")
    args = ap.parse_args(argv)
    chosen = [w for w in workloads.load() if w.name in args.workloads]
    load_before = os.getloadavg()

    plain = PlainAnswers(args.cache)
    reqs = answered_requests(chosen, args, plain)
    n_vocab, eog = plain.vocab()
    cpu = replay_part(reqs, n_vocab, frozenset(eog), args.method)
    parts = ["drafter lookup", "drafter update", "policy", "rest of the loop", "total"]
    print(f"# the loop's own CPU time per step without a draft (replay, no model): {args.method} vs plain, "
          f"{args.rounds} rounds of {', '.join(args.workloads)}; microseconds, median (mean)")
    rows = []
    for mode in ("plain", "spec"):
        rows.append([mode, len(cpu.get((mode, "total"), []))] + [
            f"{statistics.median(cpu[(mode, p)]):.1f} ({statistics.mean(cpu[(mode, p)]):.1f})"
            if cpu.get((mode, p)) else "-" for p in parts])
    print(table(["loop", "steps"] + parts, rows))
    if args.replay_only:
        return 0

    rec, (ratios, cpu_ratios), verifies, curve = model_part(args, chosen)
    load_after = os.getloadavg()
    print(f"\n# the model: {args.method} and plain on one session, threads {args.threads or 'every core'}; "
          f"ms per step, median; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after "
          f"on {os.cpu_count()} CPUs")
    rows = []
    for (wname, kind), k in sorted(rec.items()):
        n = len(k["spec"]) or len(k["plain"])
        rows.append([wname, kind, n,
                     f"{med(k['spec'], 0):.3f}" if k["spec"] else "-", f"{med(k['spec'], 1):.3f}" if k["spec"] else "-",
                     f"{med(k['plain'], 0):.3f}", f"{med(k['plain'], 1):.3f}",
                     f"{med(k['diff'], 0):+.3f}" if k["diff"] else "-", f"{med(k['diff'], 1):+.3f}" if k["diff"] else "-"])
    print(table(["workload", "speculative step", "steps", "spec wall", "spec CPU", "plain wall (same positions)",
                 "plain CPU", "spec - plain wall", "spec - plain CPU"], rows))
    one = statistics.median(c for k in rec.values() for _w, c in k["plain"]) if rec else float("nan")
    rows = []
    for lo, hi in ((2, 2), (3, 4), (5, 8), (9, 17)):
        got = [(r, p, c) for r, p, c in verifies if lo <= r <= hi]
        if not got:
            continue
        r_mid = statistics.median(r for r, _p, _c in got)
        rows.append([f"{lo}-{hi}" if hi > lo else str(lo), len(got), f"{r_mid:g}",
                     f"{statistics.median(p for _r, p, _c in got):.0f}",
                     f"{statistics.median(c for _r, _p, c in got) / one:.2f}",
                     f"{curve[int(r_mid) - 1]:.2f}" if curve else "-"])
    print(f"\nVerify steps in the answers: CPU time over the plain one-row step's median ({one * 1000:.2f} ms), "
          "and the draft policy's price for that many rows (measured at load, on an empty cache):")
    print(table(["rows", "steps", "median rows", "median position", "in the loop", "policy's curve"], rows))
    for label, got in (("decode time", ratios), ("CPU time of the steps after the first", cpu_ratios)):
        print(f"\nplain / speculative {label}, per request: " + "; ".join(
            f"{k} " + " ".join(f"{x:.3f}" for x in v) + f" (median {statistics.median(v):.3f})" for k, v in got.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
