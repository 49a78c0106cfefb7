#!/usr/bin/env python3
"""Where drafts go wrong: each drafted step of ngram-mod with the match that produced it.

    python tools/bench/tails.py [--rounds 8] [--workloads a,b] [--curve ...] [--policy auto|fixed]
                                [--dump FILE.jsonl] [--variant agreement]

Load-free, like ``profile_steps.py``: the bench's requests are answered once with plain
decoding (``counts.py``'s cache) and the real loop, ngram-mod and the draft policy replay
them. For every step where ngram-mod offered a draft it records the first lookup's match
(tokens of key + context matched; where the match is in another conversation, what it is
worth), where that occurrence is (this answer, the prompt, another conversation), the
key's other recent occurrences and how far each went on as the draft does, the length
offered, verified and accepted, how far the offered draft was right, and where a verified
draft broke (after a line end, a sentence end, inside a word; in the answer's last tokens).

Printed per kind of workload: the steps by match length, by source and by the key's
occurrences (accepted share of the verified tokens, rows lost to rejected tails); then,
per offered draft token up to the first wrong one, how often it was right by source, by
how many of the key's occurrences in this text went on the same way up to it (one; all
of two or more; a split: some went on otherwise) and by the match behind it, against the
drafter's own ``1 - 1/M``.

``--variant agreement`` instead replays the profile (``profile_steps.py``) twice, with
ngram-mod as it is and with a variant whose draft tokens take their probability from
those occurrences (a split multiplies it by the share that went on this way, agreeing
copies divide its chance of failing by their number) and, for a copy of the prompt, a
floor of 0.9 and a ceiling of 0.96: the predicted speed-ups side by side
(tools/bench/BENCHMARKS.md, "Rejected tails").
"""
import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from counts import CACHE, replayed_requests  # noqa: E402
from report import f2, pct, table  # noqa: E402

MATCH_BINS = ((-99, 3), (4, 5), (6, 8), (9, 16), (17, 32), (33, 99))
TOKEN_BINS = ((4, 5), (6, 11), (12, 24), (25, 48), (49, 999))
PROMPT_LOW, PROMPT_HIGH = 0.9, 0.96      # the variant's bounds for a copy of the prompt


def _recording(method):
    """ngram-mod keeping, per proposal, its first lookup (``seen``) and what it offered."""
    from geniex.speculative.drafters import ngram
    from geniex.speculative.options import SpecOptions
    base = ngram.make(method, SpecOptions(types=(method,)))

    class Recording(type(base)):
        def propose(self, history, n_past, room):
            self.seen = None
            draft = super().propose(history, n_past, room)
            self.offer = list(draft.tokens)
            self.offer_probs = list(draft.probs or ())
            return draft

        def _best(self, out):
            got = super()._best(out)
            if self.seen is None:
                e = got[0]
                self.seen = {"context": got[1], "match": got[2], "share": got[3],
                             "elsewhere": e is not None and e < self.seg,
                             "in_answer": e is not None and e >= self.answer,
                             "occurrences": self._occurrences()}
            return got

        def _occurrences(self):
            """The key's recent occurrences: (end, in another conversation)."""
            e, out = self.last.get(tuple(self.corpus[-self.n:])), []
            while e is not None and e >= 0 and len(out) < ngram.CANDIDATES:
                out.append((e, e < self.seg))
                e = self.prev[e]
            return out

    return Recording(base.name, base.n, base.n_min, base.n_max)


def _kind(piece):
    """What kind of text a token's piece is: the break's surroundings."""
    piece = piece.decode("utf-8", "replace") if isinstance(piece, bytes) else piece
    if "\n" in piece:
        return "line end"
    s = piece.strip()
    if s and s[-1] in ".!?:;":
        return "sentence end"
    if s and not s[0].isalnum():
        return "punctuation"
    return "word" if piece.startswith(" ") else "inside word"


def collect(args):
    """Every offered step of the measured requests, as a dict (see the module docstring)."""
    from geniex.engine.loop import FIXED, GenOptions
    from geniex.engine.replay import ReplayTarget
    from geniex.engine.sampling import SamplingParams
    from geniex.speculative import policy as pol
    _chosen, curve, plain, reqs = replayed_requests(args)
    n_vocab, eog = plain.vocab()
    eog = frozenset(eog)
    piece = plain._session().vocab.piece
    drafter = _recording(args.method)
    policy = pol.GainPolicy(curve, 0.006) if args.policy == "auto" else FIXED
    cost = [0.0, 1.0] + [pol._interpolate(curve, r) for r in range(2, 520)]
    steps = []
    for r_i, (wl, prompt, sampled, n_tokens, measured) in enumerate(reqs):
        seq = list(prompt) + list(sampled)
        answer_len = len([t for t in sampled if t not in eog])
        pos = 0
        for step in ReplayTarget(seq, n_vocab, eog).steps(
                prompt, GenOptions(max_tokens=n_tokens, sampling=SamplingParams(seed=1)), drafter, None, None, policy):
            offered = step.extra.get("offered", len(step.drafted))
            seen, drafter.seen = drafter.seen, None
            if measured and offered and seen is not None:
                full, base = drafter.offer, step.n_past + 1
                # How far the offered draft was right (the answer is known in a replay).
                right = 0
                while right < len(full) and base + right < len(seq) and seq[base + right] == full[right]:
                    right += 1
                verified, acc = len(step.drafted), step.accepted
                occ = []
                for e, elsewhere in seen.pop("occurrences"):
                    k = 0       # how many of the offered tokens this occurrence went on with
                    while k < len(full) and e + k < len(drafter.corpus) and drafter.corpus[e + k] == full[k]:
                        k += 1
                    occ.append([elsewhere, k])
                rec = dict(seen, workload=wl.name, kind=wl.kind, request=r_i, pos=pos, left=answer_len - pos,
                           offered=offered, verified=verified, accepted=acc, right=right,
                           probs=drafter.offer_probs, occ=occ)
                if acc < verified:
                    at = base + acc
                    rec["break_prev"] = _kind(piece(seq[at - 1]))
                    rec["break_draft"] = _kind(piece(full[acc]))
                    rec["tail_cost"] = cost[verified + 1] - cost[acc + 1]
                steps.append(rec)
            pos += len(step.committed)
    return steps


def _source(s):
    return "this answer" if s["in_answer"] else "elsewhere" if s["elsewhere"] else "prompt"


def _occurrence_class(s, j):
    """How the key's occurrences in this text (the chosen one included) went on at draft
    token ``j``: 'one', 'all agree' or 'split'."""
    live = [k for elsewhere, k in s["occ"] if not elsewhere and k >= j]
    agree = [k for k in live if k > j]
    return "one" if len(live) <= 1 else "all agree" if len(agree) == len(live) else "split"


def summarize(steps, key, bins, label):
    rows = []
    for name, test in bins:
        got = [s for s in steps if test(s)]
        if not got:
            continue
        ver = sum(s["verified"] for s in got)
        acc = sum(s["accepted"] for s in got)
        rows.append([name, len(got), f2(sum(s["offered"] for s in got) / len(got)),
                     f2(sum(s["right"] for s in got) / len(got)), f2(ver / len(got)), f2(acc / len(got)),
                     pct(acc, ver) if ver else "-", sum(1 for s in got if s["accepted"] < s["verified"]),
                     f"{sum(s.get('tail_cost', 0) for s in got):.1f}",
                     sum(1 for s in got if s["right"] >= s["offered"]), sum(1 for s in got if s["right"] == 0)])
    print(f"\n{label}\n")
    print(table([key, "steps", "offered", "right of offered", "verified", "accepted", "accepted/verified",
                 "broke", "tail cost (1-row decodes)", "offer all right", "offer all wrong"], rows))


def per_token(steps, label):
    """Each offered token up to the first wrong one: right how often, by class."""
    tally = {}
    for s in steps:
        src = _source(s)
        if src == "elsewhere" or s["match"] < 4:
            continue
        for j in range(min(s["offered"], s["right"] + 1)):
            m = s["match"] + j
            b = next(x for x in TOKEN_BINS if x[0] <= m <= x[1])
            rec = tally.setdefault((src, _occurrence_class(s, j), b), [0, 0])
            rec[0] += 1
            rec[1] += s["right"] > j
    rows = [[src, cls, f"{lo}-{hi}" if hi < 999 else f"{lo}+", n, pct(ok, n),
             f2(1 - 2 / (lo + min(hi, 64)))]
            for (src, cls, (lo, hi)), (n, ok) in sorted(tally.items())]
    print(f"\n{label}\n")
    print(table(["source", "occurrences", "match", "tokens", "right", "1 - 1/M (mid)"], rows))


def agreement_variant(ngram):
    """ngram-mod with each draft token's probability from the key's occurrences (see the
    module docstring)."""
    base_cls = ngram.NgramMod

    class Agreement(base_cls):
        def propose(self, history, n_past, room):
            self._sync(history, n_past + 1)
            draft = super().propose(history, n_past, room)
            if not draft.tokens:
                return draft
            e, context, match, _share = self._best([])
            run = 0                 # the draft tokens that follow the first occurrence
            while run < len(draft.tokens) and e + run < len(self.corpus) and \
                    self.corpus[e + run] == draft.tokens[run]:
                run += 1
            occ, x, tried = [], self.last.get(tuple(self.corpus[-self.n:])), 0
            while x is not None and x >= 0 and tried < ngram.CANDIDATES:
                if x != e and x >= self.seg:
                    occ.append(x)
                x, tried = self.prev[x], tried + 1
            in_prompt = self.seg <= e < self.answer
            probs, size = list(draft.probs), len(self.corpus)
            for j in range(run):
                p = ngram._confidence(match + j)
                if in_prompt:
                    p = min(max(p, PROMPT_LOW), PROMPT_HIGH)
                live = [x for x in occ if x + j < size]
                agree = [x for x in live if self.corpus[x + j] == draft.tokens[j]]
                n = len(live) + 1
                probs[j] = 1 - (1 - p) / n if len(agree) == len(live) else p * (len(agree) + 1) / n
                occ = agree
            draft.probs = probs
            return draft

    return Agreement


def compare(args):
    """Profile's predicted speed-up per workload: ngram-mod as it is, and the variant."""
    import profile_steps
    from geniex.speculative.drafters import ngram
    argv = ["--rounds", str(args.rounds), "--method", args.method, "--policy", args.policy]
    argv += ["--curve", args.curve] if args.curve else []
    argv += ["--quick"] if args.quick else []
    argv += ["--workloads", ",".join(args.workloads)] if args.workloads else []
    out = {}
    original = ngram.CLASSES["ngram-mod"]
    for name, cls in (("as is", original), (args.variant, agreement_variant(ngram))):
        ngram.CLASSES["ngram-mod"] = cls
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                profile_steps.main(argv)
        finally:
            ngram.CLASSES["ngram-mod"] = original
        out[name] = buf.getvalue()
        print(f"## ngram-mod {name}\n")
        print(out[name])
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workloads", type=lambda s: [x for x in s.split(",") if x])
    ap.add_argument("--method", default="ngram-mod", choices=("ngram-mod",))
    ap.add_argument("--policy", default="auto", choices=("auto", "fixed"))
    ap.add_argument("--curve", help="verify cost by rows, e.g. 2:2.0,4:2.8,8:4.2,16:7.9 (default: measure)")
    ap.add_argument("--cache", type=Path, default=CACHE)
    ap.add_argument("--dump", type=Path, help="write every offered step as a JSON line")
    ap.add_argument("--variant", choices=("agreement",), help="compare the profile with this variant instead")
    args = ap.parse_args(argv)
    if args.variant:
        return compare(args)
    steps = collect(args)
    if args.dump:
        args.dump.write_text("".join(json.dumps(s) + "\n" for s in steps))
    for kind in ("input", "open"):
        sel = [s for s in steps if s["kind"] == kind]
        summarize(sel, "match", [(f"{lo}..{hi}", lambda s, lo=lo, hi=hi: lo <= s["match"] <= hi)
                                 for lo, hi in MATCH_BINS], f"{kind}: offered steps by the first lookup's match")
        summarize(sel, "source", [(name, lambda s, name=name: _source(s) == name)
                                  for name in ("this answer", "prompt", "elsewhere")],
                  f"{kind}: offered steps by where the match is")
        summarize(sel, "occurrences", [(name, lambda s, name=name: _occurrence_class(s, 0) == name)
                                       for name in ("one", "all agree", "split")],
                  f"{kind}: offered steps by how the key's occurrences in this text went on")
        per_token(sel, f"{kind}: offered draft tokens (up to the first wrong one) right, by class")
        broke = [s for s in sel if s["accepted"] < s["verified"]]
        where = {}
        for s in broke:
            for f in ("break_prev", "break_draft"):
                where.setdefault(f, {}).setdefault(s[f], 0)
                where[f][s[f]] += 1
        ends = sum(1 for s in broke if s["left"] - s["accepted"] <= 3)
        print(f"\n{kind}: {len(broke)} verified drafts broke ({ends} within 3 tokens of the answer's end); "
              "the token before the break, and the wrong draft token: "
              + "; ".join(f"{f[6:]}: " + ", ".join(f"{k} {v}" for k, v in sorted(d.items()))
                          for f, d in where.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
