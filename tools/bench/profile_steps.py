#!/usr/bin/env python3
"""Where each step's time goes on first sight, per workload: a table.

    python tools/bench/profile_steps.py [--quick] [--rounds 2] [--workloads a,b] [--method ngram-mod]
                                        [--curve 2:2.0,4:2.8,8:4.2,16:7.9] [--timed]

Load-free by default: the bench's requests (``workloads/``, in the bench's order, earlier
turns unmeasured) are answered once with plain decoding (``counts.py``'s cache), then the
real loop, drafter and draft policy replay them (:mod:`geniex.engine.replay`), one drafter
for the whole sequence (its memory across requests as in the bench). Each step is priced
with a verify cost curve (``--curve``, rows -> one-row decodes; default: measured now,
the fastest of several decodes), so the time split is in one-row decodes and the same on
a busy machine as on a quiet one. Printed per workload:

- **predicted** speed-up over plain (plain's one-row decodes / the speculative steps'
  cost) and the **ceiling** of a drafter that copies perfectly: every copyable token (the
  4 tokens before it and it occurred before: in the prompt, an earlier request, the answer
  so far) drafted, in the cheapest steps the curve allows, nothing else drafted; between
  them, the **perfect policy**: the same drafter, each draft verified exactly as far as
  it is right (where that pays), i.e. the draft policy if it knew where each copy ends;
  and **without tails**: the same steps without their rejected rows (what cutting every
  draft at its first wrong token, and nothing else, would give: the most a better cut of
  the same drafts can win);
- the speculative answer's **cost split**: steps that verified no draft (one row each),
  the accepted part of drafted steps (what the step would have cost with only its right
  drafts), and **rejected tails** (the rows after the first wrong draft token);
- where copyable tokens were lost: **misses** (a step without a draft, or whose draft the
  policy declined, before a copyable token), **short** drafts (all accepted, and the next
  token was copyable too: the draft was cut by the policy or ended), **wrong** drafts (a
  wrong draft token where the copy went on);
- open work: drafted steps and their rejected tails on text with nothing to copy.

``--against speed.json`` replays a bench run's own requests (its rounds, answer lengths,
and the verify cost curve ours ngram-mod's policy used in it) and prints, per workload and
round, the predicted speed-up next to the one that run measured, and the median over
rounds of each (the bench's figure): which instance a round asked moves a workload's
ratio far more than the machine does, and where prediction and measurement part. From
runs that recorded them (``rows_s``, ``one_thread``: the bench since December 2026), also
what the verify steps cost in the answers by rows against the policy's price, and the
decodes the thread governor ran on one thread (a run where it moved to one thread priced
its drafts by that setting's curve, which the JSON does not keep: its prediction is off).
``--step-extra X`` prices every drafted step X one-row decodes above the curve.

``--timed`` instead loads the demo model twice (plain and the method, each keeping its
KV cache and memory), answers every request with both, alternating which goes first,
and times each verify step in the loop: the wall-clock ratio per workload and the verify
cost of k rows against one row where it happens (real positions). Noisy on a busy
machine; the load average is printed.
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import workloads  # noqa: E402
from configs import NCTX  # noqa: E402
from counts import CACHE, conversation, copyable_flags, requests  # noqa: E402
from report import f2, geo_mean, table  # noqa: E402

ROW_BINS = ((1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 512))
WHY = ("no draft", "policy none", "wrong", "cut")


def load(method):
    from geniex.engine.session import LoadOptions, Session
    from geniex.speculative.options import SpecOptions
    from geniex.store.demo import demo_model_path
    spec = SpecOptions(types=(method,)) if method else SpecOptions()
    return Session(demo_model_path(), LoadOptions(nctx=NCTX, spec=spec))


def answer(s, tokens, n):
    """Steps of one greedy answer: (rows, accepted, committed, offered, seconds); the
    answer's tokens and its decode time."""
    from geniex.engine.loop import GenOptions
    from geniex.engine.sampling import SamplingParams
    gen = s.generate(tokens, GenOptions(max_tokens=n, sampling=SamplingParams(seed=1)))
    steps, out = [], []
    for st in gen:
        if st.verify_time or st.drafted:
            steps.append((len(st.drafted) + 1, st.accepted, len(st.committed),
                          st.extra.get("offered", len(st.drafted)), st.draft_time + st.verify_time))
        out.extend(st.committed)
    return steps, out, gen.stats.decode_time, gen.text


class Tally:
    def __init__(self):
        self.n = self.plain_s = self.spec_s = 0.0
        self.steps = self.draft_steps = self.draft_rows = 0
        self.lost_rows = self.used_rows = 0
        self.step_s = []                    # (rows, seconds) of every speculative step
        self.copyable = self.copied = 0
        self.why = dict.fromkeys(WHY, 0)
        self.ratios = []


def against(args):
    """Per round: predicted (counts on the run's own curve) against a bench run's measured
    ratio of ours ngram-mod over ours plain (see the module docstring)."""
    import json
    from geniex.engine.loop import GenOptions
    from geniex.engine.replay import ReplayTarget
    from geniex.engine.sampling import SamplingParams
    from geniex.speculative import policy as pol
    from geniex.speculative.drafters import ngram
    from geniex.speculative.options import SpecOptions
    import dataclasses
    from counts import PlainAnswers, answered_requests
    data = json.loads(args.against.read_text())
    meta, method = data["meta"], f"ours {args.method}"
    args.rounds, args.quick = meta["rounds"], False
    seen = meta["policy_verify_cost"][method]
    curve = _parse_curve(args.curve) if args.curve else {int(r): float(c) for r, c in seen.items()}
    curve = pol.plausible(curve)              # the steps priced as the policy saw them
    # The run's own workloads and answer lengths (--quick, --tokens).
    asked = {w["name"]: w["tokens"] for w in data["workloads"]}
    chosen = [dataclasses.replace(w, tokens=asked[w.name]) for w in workloads.load() if w.name in asked]
    plain = PlainAnswers(args.cache)
    reqs = answered_requests(chosen, args, plain)
    # --step-extra: what a drafted step costs beyond the curve, in one-row decodes (the
    # policy still sizes drafts by the run's curve, as it did in the run).
    cost = [0.0, 1.0] + [pol._interpolate(curve, r) + args.step_extra for r in range(2, 520)]
    n_vocab, eog = plain.vocab()
    eog = frozenset(eog)
    drafter = ngram.make(args.method, SpecOptions(types=(args.method,)))
    policy = pol.GainPolicy({int(r): float(c) for r, c in seen.items()}, 0.006)
    speed = {(x["config"], x["workload"], x["round"]): x["n"] / x["decode_s"] for x in data["runs"]
             if x.get("decode_s")}
    per, rnd = {}, {}
    for wl, prompt, sampled, n_tokens, measured in reqs:
        steps = ReplayTarget(list(prompt) + list(sampled), n_vocab, eog).steps(
            prompt, GenOptions(max_tokens=n_tokens, sampling=SamplingParams(seed=1)), drafter, None, None, policy)
        spent = sum(cost[len(st.drafted) + 1] for st in steps)
        if not measured:
            continue
        r = rnd[wl.name] = rnd.get(wl.name, -1) + 1
        got = (speed.get((method, wl.name, r)), speed.get(("ours plain", wl.name, r)))
        per.setdefault(wl.name, []).append((len(sampled) / spent, got[0] / got[1] if all(got) else float("nan")))
    rows, geo = [], {}
    for w in chosen:
        if w.name not in per:
            continue
        pr = per[w.name]
        p_med, m_med = statistics.median(p for p, _ in pr), statistics.median(m for _, m in pr)
        geo.setdefault(w.kind, []).append((p_med, m_med))
        rows.append([w.name, w.kind] + [f"{p:.2f} / {m:.2f}" for p, m in pr] + [f"{p_med:.2f} / {m_med:.2f}"])
    print(f"# {method} over ours plain in {args.against} ({meta.get('when', '?')}, geniex {meta.get('geniex', '?')}); "
          "predicted on the curve " + ", ".join(f"{r}: {c:.2f}" for r, c in sorted(curve.items()))
          + (f" + {args.step_extra:g} per drafted step" if args.step_extra else "") + " / measured\n")
    print(table(["workload", "kind"] + [f"round {r}" for r in range(args.rounds)] + ["median (the bench's)"], rows))
    print("\nGeometric mean of the medians, predicted / measured: " + ", ".join(
        f"{k} {f2(geo_mean([p for p, _ in v]))} / {f2(geo_mean([m for _, m in v]))}" for k, v in geo.items()))
    _in_answer_costs(data, method, curve)
    return 0


def _in_answer_costs(data, method, curve):
    """What the run's verify steps cost in its answers, by rows (runs that recorded
    ``rows_s``), against the curve its policy priced them by; and the decodes its thread
    governor ran on one thread."""
    by = {}
    for x in data["runs"]:
        for key, (n, secs) in (x.get("rows_s") or {}).items():
            rec = by.setdefault((x["config"], key), [0, 0.0])
            rec[0] += n
            rec[1] += secs
    one_row = by.get((method, "1"))
    if not one_row:
        return
    unit = one_row[1] / one_row[0]
    plain = by.get(("ours plain", "1"))
    rows = []
    for (cfg, key), (n, secs) in sorted(by.items(), key=lambda kv: (kv[0][0], int(kv[0][1].rstrip("+")), kv[0][1])):
        if cfg != method:
            continue
        r = int(key.rstrip("+"))
        rows.append([key, n, f"{secs / n * 1000:.2f}", f2(secs / n / unit), f2(curve.get(r) or _interp(curve, r))])
    print(f"\nIn the answers: {method}'s steps by rows ('1+': a one-row step right after a batch), mean time, "
          f"in its own one-row steps ({unit * 1000:.2f} ms"
          + (f"; ours plain's: {plain[1] / plain[0] * 1000:.2f} ms" if plain else "") + "), and the policy's price:\n")
    print(table(["rows", "steps", "ms", "x one-row step", "policy's curve"], rows))
    one = {}
    for x in data["runs"]:
        if x.get("one_thread"):
            rec = one.setdefault(x["config"], [0, 0, 0, 0])
            rec[0] += 1
            for i, v in enumerate(x["one_thread"]):
                rec[i + 1] += v
    if one:
        print("\nThread governor, decodes on one thread (answers touched, decodes, rows, switches): " + "; ".join(
            f"{cfg} {a} / {d} / {r} / {s}" for cfg, (a, d, r, s) in sorted(one.items())))


def replay(args):
    """The load-free profile (see the module docstring)."""
    from counts import replayed_requests
    from geniex.engine.loop import FIXED, GenOptions
    from geniex.engine.replay import ReplayTarget
    from geniex.engine.sampling import SamplingParams
    from geniex.speculative import policy as pol
    from geniex.speculative.drafters import ngram
    from geniex.speculative.options import SpecOptions
    chosen, curve, plain, reqs = replayed_requests(args)
    cost = [0.0, 1.0] + [pol._interpolate(curve, r) for r in range(2, 520)]
    n_vocab, eog = plain.vocab()
    eog = frozenset(eog)
    method = args.method
    drafter = ngram.make(method, SpecOptions(types=(method,)))
    # The policy prices drafts by --policy-curve where given (a curve measured at other
    # sizes, e.g. 2:2.0,4:2.8,8:4.2,16:7.9 without 3, 5, 6 and 7 rows), the steps by --curve.
    seen = _parse_curve(args.policy_curve) if args.policy_curve else curve
    policy = pol.GainPolicy(seen, 0.006) if args.policy == "auto" else FIXED
    longest = drafter.n_max + 1
    tallies, memory = {}, []
    for wl, prompt, sampled, n_tokens, measured in reqs:
        target = ReplayTarget(list(prompt) + list(sampled), n_vocab, eog)
        answer_len = len([t for t in sampled if t not in eog])
        flags = copyable_flags(memory + list(prompt), len(prompt), sampled[:answer_len])
        t = tallies.setdefault(wl.name, Split()) if measured else Split()
        pos = 0
        for step in target.steps(prompt, GenOptions(max_tokens=n_tokens, sampling=SamplingParams(seed=1)),
                                 drafter, None, None, policy):
            rows, acc, com = len(step.drafted) + 1, step.accepted, len(step.committed)
            offered = step.extra.get("offered", len(step.drafted))
            own = pos + acc                       # the answer position of the target's own token
            nxt = own < answer_len and flags[own] and own < pos + com
            if rows == 1:
                t.plain_steps += 1
                t.plain_cost += 1.0
                t.misses += nxt
            else:
                t.draft_steps += 1
                t.draft_rows += rows
                t.kept_cost += cost[acc + 1]
                t.tail_cost += cost[rows] - cost[acc + 1]
                t.tail_rows += rows - 1 - acc
                if acc == rows - 1:
                    t.short += nxt
                else:
                    t.wrong += nxt
                if not any(flags[pos:pos + acc]) and acc < rows - 1:
                    t.blind += 1                 # a wrong draft where nothing was copyable
            t.offered += offered
            pos += com
        t.tokens += answer_len
        t.plain += len(sampled)
        t.copyable += sum(flags)
        t.ceiling += _ceiling(flags, cost, longest) + (len(sampled) - answer_len)
        memory += list(prompt) + list(sampled)
    perfect = _perfect_policy(reqs, n_vocab, eog, ngram.make(method, SpecOptions(types=(method,))), cost)

    rows_out, geo = [], {}
    for w in chosen:
        t = tallies.get(w.name)
        if t is None:
            continue
        spent = t.plain_cost + t.kept_cost + t.tail_cost
        geo.setdefault(w.kind, []).append(t.plain / spent)
        rows_out.append([
            w.name, w.kind, t.tokens, f2(t.plain / spent), f2(t.plain / (t.plain_cost + t.kept_cost)),
            f2(perfect[w.name]), f2(t.plain / t.ceiling),
            f"{t.plain_steps}", f"{t.draft_steps}", f2(t.draft_rows / t.draft_steps) if t.draft_steps else "-",
            f"{t.plain_cost:.0f}", f"{t.kept_cost:.1f}", f"{t.tail_cost:.1f} ({t.tail_rows})",
            t.copyable, t.misses, t.short, t.wrong, t.blind])
    print("# verify cost (one-row decodes) by rows: " + ", ".join(f"{r}: {c:.2f}" for r, c in sorted(curve.items())))
    print(f"# {method} (policy {args.policy}), {args.rounds} rounds{' (quick)' if args.quick else ''}; "
          "costs in one-row decodes\n")
    print(table(["workload", "kind", "tokens", "predicted x plain", "without tails x plain", "perfect policy x plain",
                 "ceiling x plain",
                 "1-row steps",
                 "drafted steps", "rows/drafted step", "cost: 1-row steps", "cost: accepted part",
                 "cost: rejected tails (rows)", "copyable", "missed (no draft)", "short draft",
                 "wrong draft", "drafted on nothing"], rows_out))
    fresh = geo.get("input", []) + geo.get("open", [])
    print("\nPredicted x plain, geometric mean: " + ", ".join(
        f"{k} {f2(geo_mean(v))}" for k, v in geo.items()) + f", work that does not repeat {f2(geo_mean(fresh))}, "
        f"lowest {f2(min(fresh, default=float('nan')))}")
    return 0


class _Knowing:
    """The drafter, telling :class:`_PerfectPolicy` how many of its draft tokens the
    answer (known in a replay) goes on with."""

    def __init__(self, drafter, state):
        self.d, self.state, self.name = drafter, state, drafter.name

    def begin(self, *a):
        self.d.begin(*a)

    def observe(self, *a):
        self.d.observe(*a)

    def propose(self, history, n_past, room):
        draft = self.d.propose(history, n_past, room)
        seq, ok = self.state["sequence"], 0
        while ok < len(draft.tokens) and n_past + 1 + ok < len(seq) and seq[n_past + 1 + ok] == draft.tokens[ok]:
            ok += 1
        self.state["right"] = ok
        return draft


class _PerfectPolicy:
    """Verifies exactly the right part of each draft, where that pays on the curve: what
    the draft policy would do if it knew where each copy ends."""

    name = "perfect"

    def __init__(self, state, cost):
        self.state, self.cost = state, cost

    def cap(self, room):
        return room

    def take(self, method, offered, grade=0, probs=None):
        best, rate = 0, 1.0
        for k in range(1, min(self.state["right"], offered) + 1):
            if (k + 1) / self.cost[k + 1] > rate:
                best, rate = k, (k + 1) / self.cost[k + 1]
        return best

    def observe(self, *a, **k):
        pass


def _perfect_policy(reqs, n_vocab, eog, drafter, cost):
    """{workload: plain cost / cost} with the same drafter and a policy that knows the
    answer: the part of the gap to the ceiling that is the policy's not knowing where a
    copy ends (the rest is the drafter's)."""
    from geniex.engine.loop import GenOptions
    from geniex.engine.replay import ReplayTarget
    from geniex.engine.sampling import SamplingParams
    state = {"sequence": [], "right": 0}
    knowing, policy, out = _Knowing(drafter, state), _PerfectPolicy(state, cost), {}
    for wl, prompt, sampled, n_tokens, measured in reqs:
        state["sequence"] = list(prompt) + list(sampled)
        target = ReplayTarget(state["sequence"], n_vocab, eog)
        spent = sum(cost[len(step.drafted) + 1] for step in target.steps(
            prompt, GenOptions(max_tokens=n_tokens, sampling=SamplingParams(seed=1)), knowing, None, None, policy))
        if measured:
            rec = out.setdefault(wl.name, [0, 0.0])
            rec[0] += len(sampled)
            rec[1] += spent
    return {name: plain / spent for name, (plain, spent) in out.items()}


class Split:
    """One workload's steps, priced."""

    def __init__(self):
        self.tokens = self.plain = self.copyable = 0
        self.plain_steps = self.draft_steps = self.draft_rows = self.tail_rows = self.offered = 0
        self.plain_cost = self.kept_cost = self.tail_cost = self.ceiling = 0.0
        self.misses = self.short = self.wrong = self.blind = 0


def _ceiling(flags, cost, longest):
    """The least cost of an answer whose copyable tokens (``flags``) are drafted perfectly:
    each step commits the target's own token plus up to ``longest - 1`` accepted drafts,
    all copyable, and pays ``cost[rows]``."""
    n = len(flags)
    best = [0.0] + [float("inf")] * (n + 1)
    for j in range(n + 1):
        if best[j] == float("inf"):
            continue
        k = 0
        while True:
            end = min(j + k + 1, n + 1)
            best[end] = min(best[end], best[j] + cost[k + 1])
            if k + 1 >= longest or j + k >= n or not flags[j + k]:
                break
            k += 1
    return best[n + 1] - 1.0 if best[n + 1] < float("inf") else float(n)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="the bench's --quick answer lengths")
    ap.add_argument("--workloads", type=lambda s: [x for x in s.split(",") if x])
    ap.add_argument("--method", default="ngram-mod")
    ap.add_argument("--policy", default="auto", choices=("auto", "fixed"))
    ap.add_argument("--curve", help="verify cost by rows, e.g. 2:2.0,4:2.8,8:4.2,16:7.9 (default: measure)")
    ap.add_argument("--cache", type=Path, default=CACHE, help="plain answers cache (counts.py's)")
    ap.add_argument("--policy-curve", help="the verify cost curve the draft policy sees (default: --curve); the "
                    "steps are priced by --curve either way: what a policy misled by its curve costs")
    ap.add_argument("--timed", action="store_true", help="wall clock on the real model instead (noisy)")
    ap.add_argument("--against", type=Path, help="a bench run's JSON (speed.json): predicted vs measured per round")
    ap.add_argument("--step-extra", type=float, default=0.0,
                    help="with --against: one-row decodes a drafted step costs beyond the curve")
    args = ap.parse_args(argv)
    if args.against:
        return against(args)
    return timed(args) if args.timed else replay(args)


def timed(args):
    chosen = [w for w in workloads.load() if not args.workloads or w.name in args.workloads]
    load_before = os.getloadavg()[0]
    plain, spec = load(""), load(args.method)
    curve = getattr(spec.policy, "costs", {})
    from geniex.engine.chat import template_for
    tpl = template_for(plain.model)
    tallies, answers_of, i, memory = {}, {}, 0, []
    t0 = time.perf_counter()
    for w, r, turns, n, measured in requests(chosen, args.rounds, args.quick):
        earlier = answers_of.get((w.name, r), [])
        prompt = plain.tokenize_prompt(tpl.render(conversation(turns, earlier)))
        order = (plain, spec) if i % 2 else (spec, plain)
        i += 1
        res = {}
        for s in order:
            res[s is spec] = answer(s, prompt, n)
        p_steps, p_out, p_s, p_text = res[False]
        s_steps, s_out, s_s, _ = res[True]
        if p_out != s_out:
            print(f"WARNING: {w.name} round {r}: the speculative answer differs from the plain one")
        answers_of[(w.name, r)] = earlier + [p_text]
        # Copyable tokens of this answer, judged against what the drafter knew before it.
        flags = copyable_flags(memory + list(prompt), len(prompt), s_out)
        memory += list(prompt) + s_out
        if not measured:
            continue
        t = tallies.setdefault(w.name, Tally())
        t.n += len(s_out)
        t.plain_s += p_s
        t.spec_s += s_s
        t.ratios.append(p_s / s_s if s_s else 0.0)
        t.copyable += sum(flags)
        pos = 0
        for rows, acc, com, offered, secs in s_steps:
            t.steps += 1
            t.step_s.append((rows, secs))
            if rows > 1:
                t.draft_steps += 1
                t.draft_rows += rows
                t.lost_rows += rows - 1 - acc
            t.used_rows += min(rows, acc + 1)
            t.copied += sum(flags[pos:pos + min(acc, com)])
            own = pos + acc
            if own < len(flags) and flags[own] and acc < com + 1 and own < pos + com:
                why = ("no draft" if not offered else "policy none" if rows == 1
                       else "wrong" if acc < rows - 1 else "cut")
                t.why[why] += 1
            pos += com
    elapsed = time.perf_counter() - t0
    load_after = os.getloadavg()[0]

    one_all = [s for t in tallies.values() for r, s in t.step_s if r == 1]
    one = statistics.median(one_all) if one_all else 1.0
    rows_out = []
    for w in chosen:
        t = tallies.get(w.name)
        if t is None:
            continue
        own_one = statistics.median([s for r, s in t.step_s if r == 1] or [one])
        total = t.spec_s / own_one                 # the answer's time in one-row steps
        lost = t.lost_rows * _marginal(t.step_s, one)
        rows_out.append([
            w.name, w.kind, int(t.n), f2(statistics.median(t.ratios)), f2(t.steps / t.n),
            f"{t.steps - t.draft_steps} / {t.draft_steps}",
            f2(t.draft_rows / t.draft_steps) if t.draft_steps else "-",
            f"{total:.0f}", f"{lost / own_one:.1f}",
            f"{t.copyable}", f"{t.copied}", " ".join(f"{k} {v}" for k, v in t.why.items())])
    print(f"# {args.method} vs plain, {args.rounds} rounds{' (quick)' if args.quick else ''}; "
          f"load average {load_before:.2f} -> {load_after:.2f} on {os.cpu_count()} CPUs; {elapsed:.0f} s")
    print(table(["workload", "kind", "tokens", "plain/spec time", "decodes/token", "steps 1-row / drafted",
                 "rows/drafted step", "spec time (1-row steps)", "lost to rejected rows",
                 "copyable", "copied", "copyable not drafted: why"], rows_out))
    print("\nVerify step cost by rows, measured in the loop (median step / median one-row step), "
          "and the draft policy's calibrated curve:\n")
    allsteps = [x for t in tallies.values() for x in t.step_s]
    crow = []
    for lo, hi in ROW_BINS:
        got = [s for r, s in allsteps if lo <= r <= hi]
        if not got:
            continue
        rows_mid = statistics.median([r for r, s in allsteps if lo <= r <= hi])
        cal = _interp(curve, rows_mid) if curve else float("nan")
        crow.append([f"{lo}-{hi}" if hi != lo else str(lo), len(got), f"{rows_mid:g}",
                     f"{statistics.median(got) * 1000:.2f}", f2(statistics.median(got) / one), f2(cal)])
    print(table(["rows", "steps", "median rows", "median ms", "x one-row step", "policy's curve"], crow))
    return 0


def _marginal(step_s, one):
    """Seconds one more verify row costs, from the in-loop steps (least squares of time on
    rows over the multi-row steps, 0 if there are too few)."""
    pts = [(r, s) for r, s in step_s if r > 1]
    if len(pts) < 3:
        return one
    mr = statistics.mean(r for r, _ in pts)
    ms = statistics.mean(s for _, s in pts)
    var = sum((r - mr) ** 2 for r, _ in pts)
    return max(0.0, sum((r - mr) * (s - ms) for r, s in pts) / var) if var else one


def _parse_curve(text):
    """``2:2.0,4:2.8`` -> {1: 1.0, 2: 2.0, 4: 2.8}."""
    return {1: 1.0, **{int(a): float(b) for a, b in (x.split(":") for x in text.split(","))}}


def _interp(curve, rows):
    from geniex.speculative.policy import _interpolate
    return _interpolate(curve, rows)


if __name__ == "__main__":
    sys.exit(main())
