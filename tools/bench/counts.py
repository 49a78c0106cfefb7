#!/usr/bin/env python3
"""Where the time goes when drafting on first sight: exact counts, no timing.

    python tools/bench/counts.py [--rounds R] [--workloads a,b] [--methods ngram-mod,ngram-mod:4/2/16]
                                 [--policy auto|fixed] [--curve 2:2.0,4:2.8,8:4.1,16:7.2] [--grid]

Speculative output equals plain output token for token, so the drafts and acceptances of
any drafter on a request follow from the plain answer alone. This tool answers the
bench's requests (``workloads/``, in the bench's order, the earlier turns of a
conversation included) once with plain decoding on the demo model (cached in a file),
then runs the real loop (:func:`geniex.engine.loop.steps`) with the real drafters and
draft policy against a stand-in context that replays each answer
(``tests/support/replay.py``), one drafter for the whole sequence, so its memory across
requests is what the bench's would be. Printed per workload and method:

- target decodes per answer token, rows verified per step, and the **predicted
  speed-up** over plain decoding: plain's decodes / the sum of each step's verify cost,
  from a verify-cost curve (``--curve``: rows -> cost in one-row decodes; by default
  measured here, the fastest of several decodes);
- acceptance by position in the answer, the draft lengths verified;
- how often a draft token of each probability (the drafter's own, where it gives one)
  was right, counting each verified token up to the first rejection, as the draft
  policy learns it (``--policy fixed`` with a long maximum shows it unbiased by the
  policy's cuts);
- **copyable tokens**: answer tokens that a 4-token match in what the drafter could know
  (the prompt, earlier requests, the answer so far) continues correctly; how many of them
  came from an accepted draft, and why the others did not (no draft that step, the draft
  cut by the policy or the maximum, the first tokens of a span).

``--grid`` replays every method given over match lengths and longest drafts
(:data:`GRID_N` x :data:`GRID_MAX`): how the n-gram defaults are chosen. The machine's load
does not change a count; only the measured curve depends on it (pass ``--curve`` to
compare runs).
"""
import argparse
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
sys.path.append(str(ROOT / "tests" / "support"))     # for the replay target (replay.py) only

import workloads  # noqa: E402
from configs import parse_method  # noqa: E402
from report import f2, geo_mean, pct, table  # noqa: E402

CACHE = Path.home() / ".cache" / "geniex-bench" / "answers.json"
COPY_MATCH = 4          # a token is copyable when the 4 tokens before it, and it, occurred before
GRID_N = (2, 3, 4, 6, 8)
GRID_MAX = (4, 8, 16, 32)


def conversation(turns, answers):
    """Chat messages of a request: its user ``turns``, each earlier one followed by its
    ``answers`` entry (an agent session's later turn sees the earlier answers)."""
    messages = []
    for i, turn in enumerate(turns):
        messages.append({"role": "user", "content": turn})
        if i < len(turns) - 1:
            messages.append({"role": "assistant", "content": answers[i]})
    return messages


def requests(chosen, rounds, quick):
    """The bench's request sequence: (workload, round, messages so far, n, measured)."""
    for r in range(rounds):
        for w in chosen:
            turns = w.instance(r).turns
            for i in range(len(turns)):
                yield w, r, turns[:i + 1], (w.quick_tokens if quick else w.tokens), i == len(turns) - 1


class PlainAnswers:
    """Plain greedy answers of the demo model, cached by prompt and length."""

    def __init__(self, path):
        self.path = path
        self.cache = json.loads(path.read_text()) if path.exists() else {}
        self.session = None

    def _session(self):
        if self.session is None:
            from geniex.engine.session import LoadOptions, open_session
            from geniex.store.resolved import from_gguf_path
            from geniex.store.demo import demo_model_path
            self.session = open_session(from_gguf_path(demo_model_path()), LoadOptions(nctx=4096))
        return self.session

    def prompt(self, turns, answers):
        """Token ids of a conversation: user turns, the earlier ones answered by ``answers``."""
        from geniex.engine.chat import template_for
        s = self._session()
        messages = conversation(turns, answers)
        return s.tokenize_prompt(template_for(s.model).render(messages))

    def answer(self, tokens, n):
        """(sampled tokens incl. an end token, text) of the plain greedy answer."""
        key = hashlib.sha1(json.dumps([tokens, n]).encode()).hexdigest()
        if key not in self.cache:
            from geniex.engine.loop import GenOptions
            from geniex.engine.sampling import SamplingParams
            s = self._session()
            s.reset()
            gen = s.generate(tokens, GenOptions(max_tokens=n, sampling=SamplingParams(seed=1)))
            sampled = [t for step in gen for t in step.target]
            self.cache[key] = [sampled, gen.text]
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.cache))
        return self.cache[key]

    def vocab(self):
        s = self._session()
        return s.vocab.n_tokens, sorted(s.vocab.eog)


def measured_curve():
    """The demo model's verify cost curve on this machine (the draft policy's calibration)."""
    from geniex.engine.session import LoadOptions, open_session
    from geniex.speculative import policy
    from geniex.store.demo import demo_model_path
    from geniex.store.resolved import from_gguf_path
    s = open_session(from_gguf_path(demo_model_path()), LoadOptions(nctx=4096))
    try:
        costs, _one = policy.calibrate(s.ctx, s.batch, 1, repeats=5)
        costs = policy.plausible(costs)
    finally:
        s.close()
    return costs


class Tally:
    """Counts of one method on one workload, summed over its requests."""

    def __init__(self):
        self.n = self.steps = self.plain_steps = self.rows = 0
        self.cost = 0.0
        self.drafted = self.accepted = self.offered = 0
        self.by_pos = {}                  # bucket -> [drafted, accepted]
        self.lengths = {}
        self.copyable = self.copied = 0
        self.missed = {why: 0 for why in WHY}
        self.calibration = {}             # probability bucket -> [right, wrong]


BUCKETS = ((0, 16), (16, 64), (64, 1 << 30))
WHY = ("no draft", "policy none", "wrong draft", "policy cut", "drafter end")


def _why(offered, drafted, accepted):
    """Why the token after a step's accepted drafts came from the target's own row."""
    if not offered:
        return "no draft"
    if not drafted:
        return "policy none"
    if accepted < drafted:
        return "wrong draft"
    return "policy cut" if drafted < offered else "drafter end"


def copyable_flags(source, prompt_len, answer, k=COPY_MATCH):
    """For each answer token: whether the k tokens before it and it occurred earlier in
    ``source`` (memory + prompt) or earlier in the answer."""
    seen = set()
    seq = list(source)
    for i in range(k, len(seq)):
        seen.add(tuple(seq[i - k:i + 1]))
    flags = []
    for t in answer:
        seq.append(t)
        gram = tuple(seq[-k - 1:])
        flags.append(len(gram) == k + 1 and gram in seen)
        if len(gram) == k + 1:
            seen.add(gram)
    return flags


def replay_all(reqs, n_vocab, eog, method, params, policy_name, curve):
    """Run one drafter over the whole request sequence; {workload: Tally}."""
    from replay import ReplayTarget

    from geniex.engine.loop import FIXED, GenOptions
    from geniex.engine.sampling import SamplingParams
    from geniex.engine.stats import Stats
    from geniex.speculative import policy as pol
    from geniex.speculative.drafters import ngram
    from geniex.speculative.options import SpecOptions
    n, lo, hi = params
    drafter = ngram.make(method, SpecOptions(types=(method,), ngram_n=n, ngram_min=lo, ngram_max=hi))
    policy = pol.GainPolicy(curve, 0.006) if policy_name == "auto" else FIXED
    price = pol.GainPolicy(curve, 0.006).verify_cost      # k drafts -> a (k+1)-row verify, in one-row decodes
    tallies = {}
    memory = []
    calibration = {}
    for wl, prompt, sampled, n_tokens, measured in reqs:
        target = ReplayTarget(list(prompt) + list(sampled), n_vocab, eog)
        stats = Stats()
        answer_len = len([t for t in sampled if t not in eog])
        flags = copyable_flags(memory + list(prompt), len(prompt), sampled[:answer_len])
        pos, via_draft = 0, [False] * answer_len
        t = tallies.setdefault(wl.name, Tally()) if measured else Tally()
        for step in target.steps(prompt, GenOptions(max_tokens=n_tokens, sampling=SamplingParams(seed=1)),
                                 drafter, None, stats, policy):
            rows = len(step.drafted) + 1
            t.rows += rows
            t.cost += price(rows - 1)
            offered = step.extra.get("offered", len(step.drafted))
            for i, p in enumerate(step.draft_probs or ()):
                if i > step.accepted or i >= len(step.target):
                    break
                rec = calibration.setdefault(_bucket(p), [0, 0])
                rec[0 if i < step.accepted else 1] += 1
            if step.drafted:
                t.lengths[len(step.drafted)] = t.lengths.get(len(step.drafted), 0) + 1
                b = next(i for i, (a, z) in enumerate(BUCKETS) if a <= pos < z)
                rec = t.by_pos.setdefault(b, [0, 0])
                rec[0] += len(step.drafted)
                rec[1] += step.accepted
            for j in range(min(step.accepted, answer_len - pos)):
                via_draft[pos + j] = True
            # Why a copyable token that the target's own row gave (not a draft) was missed.
            own = pos + step.accepted
            if own < answer_len and flags[own] and own < pos + len(step.committed):
                t.missed[_why(offered, len(step.drafted), step.accepted)] += 1
            t.offered += offered
            pos += len(step.committed)
        t.n += stats.decode_tokens
        t.steps += stats.steps
        t.plain_steps += len(sampled)
        t.drafted += stats.drafted
        t.accepted += stats.accepted
        t.copyable += sum(flags)
        t.copied += sum(1 for f, d in zip(flags, via_draft) if f and d)
        memory += list(prompt) + list(sampled)
    return tallies, calibration


PROB_BUCKETS = (0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.98, 0.99)


def _bucket(p):
    return max([b for b in PROB_BUCKETS if p >= b], default=0.0)


def _rate(rec):
    return (rec[0], rec[0] + rec[1]) if rec else (0, 0)


def replayed_requests(args):
    """``(chosen, curve, plain, reqs)``: the workloads ``args`` chose, the verify cost curve
    (``--curve`` or measured), the plain answerer and each request with its prompt and
    plain answer ``(workload, prompt, sampled, n, measured)`` (later turns see the
    earlier turns' answers)."""
    chosen = [w for w in workloads.load() if not args.workloads or w.name in args.workloads]
    if args.curve:
        curve = {1: 1.0, **{int(a): float(b) for a, b in (x.split(":") for x in args.curve.split(","))}}
    else:
        curve = measured_curve()
    plain = PlainAnswers(args.cache)
    return chosen, curve, plain, answered_requests(chosen, args, plain)


def answered_requests(chosen, args, plain):
    """Each request of ``chosen`` (``args.rounds``, ``args.quick``) with its prompt and
    ``plain``'s answer: ``(workload, prompt, sampled, n, measured)``; a later turn's
    prompt holds the earlier turns' answers."""
    reqs, answers_of = [], {}
    for w, r, turns, n, measured in requests(chosen, args.rounds, args.quick):
        earlier = answers_of.get((w.name, r), [])
        prompt = plain.prompt(turns, earlier)
        sampled, text = plain.answer(prompt, n)
        answers_of[(w.name, r)] = earlier + [text]
        reqs.append((w, prompt, sampled, n, measured))
    return reqs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="the bench's --quick answer lengths")
    ap.add_argument("--workloads", type=lambda s: [x for x in s.split(",") if x])
    ap.add_argument("--methods", type=lambda s: [x for x in s.split(",") if x], default=["ngram-mod"],
                    help="comma list of method[:n/min/max] (default ngram-mod at its defaults)")
    ap.add_argument("--policy", default="auto", choices=("auto", "fixed"))
    ap.add_argument("--curve", help="verify cost by rows, e.g. 2:2.0,4:2.8,8:4.1,16:7.2 (default: measure)")
    ap.add_argument("--grid", action="store_true", help="every method over GRID_N x GRID_MAX (min draft 2)")
    ap.add_argument("--cache", type=Path, default=CACHE, help=f"plain answers cache (default {CACHE})")
    args = ap.parse_args(argv)
    chosen, curve, plain, reqs = replayed_requests(args)
    print("# verify cost (one-row decodes) by rows: " + ", ".join(f"{r}: {c:.2f}" for r, c in sorted(curve.items())))
    n_vocab, eog = plain.vocab()
    eog = frozenset(eog)
    labels = args.methods
    if args.grid:
        labels = [f"{parse_method(m)[0]}:{n}/2/{hi}" for m in args.methods for n in GRID_N for hi in GRID_MAX]
    rows, geo, cal_rows = [], [], []
    for label in labels:
        method, params = parse_method(label)
        tallies, calibration = replay_all(reqs, n_vocab, eog, method, params, args.policy, curve)
        if calibration:
            cal_rows.append([label] + [f"{pct(*_rate(calibration.get(b)))} ({sum(calibration.get(b, (0, 0)))})"
                                       for b in (0.0,) + PROB_BUCKETS])
        predicted = {kind: [] for kind in workloads.KINDS}
        for w in chosen:
            t = tallies.get(w.name)
            if t is None:
                continue
            acc_pos = []
            for b in range(len(BUCKETS)):
                d, a = t.by_pos.get(b, (0, 0))
                acc_pos.append(pct(a, d) if d else "-")
            lengths = " ".join(f"{k}:{v}" for k, v in sorted(t.lengths.items()))
            predicted[w.kind].append(t.plain_steps / t.cost)
            rows.append([label, w.name, t.n, f2(t.steps / t.n), f2(t.rows / t.steps), f2(t.plain_steps / t.cost),
                         f"{t.drafted}/{t.accepted}", *acc_pos, t.copyable, t.copied,
                         " ".join(f"{k} {v}" for k, v in t.missed.items()), lengths or "-"])
        fresh = predicted["input"] + predicted["open"]
        geo.append([label, f2(geo_mean(predicted["input"])), f2(geo_mean(predicted["open"])), f2(geo_mean(fresh)),
                    f2(min(fresh, default=float("nan"))), f2(geo_mean(predicted["replayed"]))])
    print(table(["method", "workload", "tokens", "decodes/token", "rows/step", "predicted x plain",
                 "drafted/accepted", "acc 0-15", "16-63", "64+", "copyable", "copied",
                 "copyable not drafted, why", "draft lengths"], rows))
    if cal_rows:
        print("\nDraft tokens right, by the drafter's probability for them (verified tokens up to the first "
              "rejection; in brackets how many):\n")
        print(table(["method"] + [f"p >= {b}" if b else "p < 0.5" for b in (0.0,) + PROB_BUCKETS], cal_rows))
    print("\nPredicted speed-up over plain decoding, geometric mean by kind of workload:\n")
    print(table(["method", "input-grounded", "open", "work that does not repeat", "lowest", "replayed"], geo))
    return 0


if __name__ == "__main__":
    sys.exit(main())
