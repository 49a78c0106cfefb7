#!/usr/bin/env python3
"""Decode speed of geniex against llama.cpp's own server, on work that does not repeat itself.

    python tools/bench/bench.py --quick                 # a few minutes: 2 rounds, short answers
    python tools/bench/bench.py                         # the full run (see BENCHMARKS.md)
    python tools/bench/bench.py --publish               # ... and write the committed figures

Each round asks every workload (``tools/bench/workloads/``) a request no earlier round
asked: another function to edit, passage to quote, table to convert, question; an agent
session whose second turn edits the first turn's answer; short (32-token) and long
(512-token) answers. What the drafters remember across requests then helps exactly as
much as it would for a user. The ``replayed`` workload asks the same request every round:
its rows are labelled and never the headline.

Every configuration (``configs.py``: ours and llama.cpp's server, each at its defaults
and native again at ours' settings) runs in its own worker process (``worker.py``),
keeping its state (KV cache, n-gram memory) across requests as its server does. In each
round every configuration answers every workload, in a rotated order. The run's figures
go to a JSON file; ``report.py`` renders the report, the plot and the README's speed table
from it. Ours' speculative answers are checked token for token against ours' plain
answers; native's texts are compared with ours'.

The bench warns when the machine is busy: a high load average, or multi-threaded
batches that stall (a 2-row decode costing several one-row decodes).
"""
import argparse
import datetime
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import configs  # noqa: E402
import report  # noqa: E402
import workloads  # noqa: E402
from worker import Worker  # noqa: E402

PUBLISHED = HERE / "speed.json"
# A 2-row batch costing more than this many one-row decodes: multi-threaded batches stall
# (another process holds a core while OpenMP threads spin-wait).
STALL = 4.0


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="2 rounds, shorter answers, each side at its defaults only (a few minutes)")
    ap.add_argument("--rounds", type=int, help="rounds (default 6; quick 2)")
    ap.add_argument("--tokens", type=int, default=0, metavar="N",
                    help="answer at most N tokens per request instead of each workload's length "
                         "(a smoke run: the suite's check that the bench works end to end)")
    ap.add_argument("--workloads", type=_names, help="comma list (default: all): " +
                    ", ".join(w.name for w in workloads.load()))
    ap.add_argument("--methods", type=_names, default=["ngram-mod"],
                    help="ours' drafting methods, method[:n/min/max] (default ngram-mod, the one native is compared with)")
    ap.add_argument("--no-native", action="store_true", help="skip llama.cpp's server")
    ap.add_argument("--load", type=int, default=0, metavar="N",
                    help="run N busy-looping processes during the rounds (a reproducible busy neighbour)")
    ap.add_argument("--json", type=Path, help="write the run's figures here (default: a temporary file)")
    ap.add_argument("--calibration", type=Path, metavar="FILE",
                    help="start ours' draft policy from this calibration cache (a data dir's calibration.json) "
                         "instead of measuring the verify costs afresh (the suite's smoke run: measured once per run)")
    ap.add_argument("--report", type=Path, help="also render the report (markdown) to this file")
    ap.add_argument("--publish", action="store_true",
                    help=f"write the figures to {PUBLISHED.relative_to(ROOT)} and render the committed report, "
                         "plot and README table from them (report.py --write)")
    return ap.parse_args(argv)


def _names(text):
    return [x.strip() for x in text.split(",") if x.strip()]


def choose_workloads(args):
    chosen = workloads.load()
    if args.workloads:
        known = {w.name: w for w in chosen}
        missing = [n for n in args.workloads if n not in known]
        if missing:
            raise SystemExit(f"unknown workload {', '.join(missing)}; known: {', '.join(known)}")
        chosen = [w for w in chosen if w.name in args.workloads]
    fewest = min(w.rounds for w in chosen)
    if args.rounds > fewest:
        raise SystemExit(f"{args.rounds} rounds would repeat a request: a workload has {fewest} instances")
    return chosen


def answer_length(w, args):
    """How many tokens a request of workload ``w`` may answer: ``--tokens``, else the
    workload's length (its quick one with ``--quick``)."""
    return args.tokens or (w.quick_tokens if args.quick else w.tokens)


def conversations(plain, chosen, args):
    """Per (workload, round): the token ids of every turn's prompt, the earlier turns'
    answers being ours' plain answers (so every configuration gets the same prompts)."""
    out = {}
    for w in chosen:
        n = answer_length(w, args)
        for r in range(args.rounds):
            messages, prompts = [], []
            for i, turn in enumerate(w.instance(r).turns):
                messages.append({"role": "user", "content": turn})
                prompts.append(plain.ask("tokenize", messages=messages))
                if i + 1 < len(w.instance(r).turns):
                    answer = plain.ask("run", tokens=prompts[-1], n=n)["text"]
                    messages.append({"role": "assistant", "content": answer})
            out[(w.name, r)] = prompts
    return out


def busy_warnings(load_before, loads, costs, cpus, policy_costs):
    """What made this run's timings doubtful, in words (empty: nothing seen)."""
    out = []
    if load_before > 0.5 * cpus:
        out.append(f"the machine was busy before the run started (load average {load_before:.2f} on {cpus} CPUs)")
    # The bench itself keeps about one decode running (every core while it runs).
    high = [x for x in loads if x > cpus + 1]
    if high:
        out.append(f"load average reached {max(high):.2f} during the rounds ({cpus} CPUs; the bench alone "
                   f"keeps about {cpus} busy)")
    for name, curve in policy_costs.items():
        if curve and curve["2"] > STALL:
            out.append(f"{name}'s draft policy measured a 2-row verify at {curve['2']:.1f} one-row decodes when "
                       "it loaded (batches stalling then): it drafts less than on a quiet machine")
    stalled = [c[1] / c[0] for c in costs if c[1] / c[0] > STALL]
    if stalled:
        out.append(f"multi-threaded batches stalled in {len(stalled)} of {len(costs)} checks (a 2-row decode "
                   f"cost up to {max(stalled):.0f}x a one-row decode): another process held a core")
    return out


def main(argv=None):
    args = parse_args(argv)
    args.rounds = args.rounds or (2 if args.quick else 6)
    chosen = choose_workloads(args)
    from geniex.store.demo import INSTALL_HINT, demo_model_path
    path = demo_model_path()
    if path is None:
        raise SystemExit(f"the demo model is not installed: {INSTALL_HINT}")
    cfgs = configs.make(quick=args.quick, methods=args.methods, native=not args.no_native, one_thread=args.load > 0)

    # A terminated bench still ends its workers and busy loops (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"terminated; worker logs in {logdir}"))
    t_start = time.perf_counter()
    cpus = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    logdir = tempfile.mkdtemp(prefix="geniex-bench-")
    if args.calibration:
        # The workers' data dir (worker.py) starts with it; without it they measure afresh.
        (Path(logdir) / "data").mkdir()
        shutil.copyfile(args.calibration, Path(logdir) / "data" / "calibration.json")
    workers, burners, loads, costs = {}, [], [], []
    runs = []
    try:
        for c in cfgs:
            # One at a time: ours measures the verify cost curve its draft policy uses when
            # it loads, and another worker loading beside it would make batches look dear.
            workers[c.name] = Worker(c, path, logdir)
            workers[c.name].wait_ready()
        plain = workers["ours plain"]
        prompts = conversations(plain, chosen, args)
        print(f"# geniex bench: {path.name}, {len(cfgs)} configurations, {len(chosen)} workloads, "
              f"{args.rounds} rounds; {cpus} CPUs, load average {load_before:.2f}; worker logs in {logdir}",
              flush=True)
        for _ in range(args.load):
            burners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        for r in range(args.rounds):
            t_round = time.perf_counter()
            for wi, wl in enumerate(chosen):
                n = answer_length(wl, args)
                shift = (r * len(chosen) + wi) % len(cfgs)
                order = cfgs[shift:] + cfgs[:shift]
                for c in (order[::-1] if r % 2 else order):
                    turns = prompts[(wl.name, r)]
                    for earlier in turns[:-1]:      # the conversation so far, unmeasured
                        workers[c.name].ask("run", tokens=earlier, n=n)
                    out = workers[c.name].ask("run", tokens=turns[-1], n=n)
                    runs.append(_record(c, wl, r, out))
            cost = plain.ask("row_cost")
            costs.append([cost[str(k)] for k in (1, 2, 4, 8)])
            loads.append(os.getloadavg()[0])
            print(f"# round {r + 1}/{args.rounds}: {time.perf_counter() - t_round:.0f} s, "
                  f"load average {loads[-1]:.2f}", flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        for w in workers.values():
            w.close()

    _compare_texts(runs)
    policy_costs = {n: w.hello.get("verify_cost") for n, w in workers.items() if w.hello.get("verify_cost")}
    warnings = busy_warnings(load_before, loads, costs, cpus, policy_costs)
    if args.load:
        warnings.insert(0, f"{args.load} busy-looping process(es) ran beside the bench on purpose (--load)")
    data = {
        "meta": {
            "when": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
            "command": "python tools/bench/bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "model": path.name, "model_bytes": plain.hello["model_bytes"], "cpus": cpus,
            "load_before": round(load_before, 2), "loads": [round(x, 2) for x in loads],
            "seconds": round(time.perf_counter() - t_start), "rounds": args.rounds, "quick": args.quick,
            "geniex": _git_head(), "llama_cpp": "b11549", "warnings": warnings,
            "row_cost": costs, "policy_verify_cost": policy_costs,
        },
        "configs": [c.to_json() for c in cfgs],
        "workloads": [{"name": w.name, "kind": w.kind, "describe": w.describe,
                       "tokens": answer_length(w, args)} for w in chosen],
        "runs": runs,
    }
    out = PUBLISHED if args.publish else args.json or Path(logdir) / "speed.json"
    out.write_text(dump(data), encoding="utf-8")
    print(report.render_report(data))
    if args.report:
        args.report.write_text(report.render_report(data), encoding="utf-8")
    if args.publish:
        report.write_all(data)
    for line in warnings:
        print(f"WARNING: {line}")
    print(f"\n# figures in {out}; done in {time.perf_counter() - t_start:.0f} s, "
          f"load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}")


def dump(data):
    """The JSON text of a run: one line per section and per run (readable diffs)."""
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in data.items() if k != "runs"]
    runs = [f"  {json.dumps(x)}," for x in data["runs"]]
    runs[-1] = runs[-1].rstrip(",")
    return "\n".join(["{"] + lines + [' "runs": ['] + runs + [" ]", "}"]) + "\n"


def _record(cfg, wl, r, out):
    """One run as the JSON keeps it: counts and times, and a digest of the answer."""
    rec = {"config": cfg.name, "workload": wl.name, "round": r, "n": out["n"], "decode_s": out["decode_s"],
           "drafted": out["drafted"], "accepted": out["accepted"], "stop": out["stop"],
           "text_sha": hashlib.sha1(out["text"].encode()).hexdigest()[:12],
           "_tokens": out["tokens"]}
    for key in ("steps", "offered", "hist", "draft_s", "verify_s", "detail", "rows_s", "one_thread"):
        if out.get(key):
            rec[key] = out[key]
    return rec


def _compare_texts(runs):
    """``same_tokens`` on ours' speculative runs (token ids against ours plain's, same
    workload and round: they must be equal)."""
    plain = {(x["workload"], x["round"]): x["_tokens"] for x in runs if x["config"] == "ours plain"}
    for x in runs:
        tokens = x.pop("_tokens")
        if x["config"].startswith("ours ") and x["config"] != "ours plain":
            x["same_tokens"] = tokens == plain[(x["workload"], x["round"])]


def _git_head():
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


if __name__ == "__main__":
    sys.exit(main())
