"""``--spec-trace``: one JSON line per loop step, then one summary line.

Each step line: ``step``, ``pos`` (position of the pending token), ``last`` (the pending
token), ``method``, ``drafted`` (+ ``draft_probs`` where the method has them),
``target`` (the target's sampled token for each examined row), ``accepted``,
``committed`` (answer tokens of this step) and ``text`` (their text), ``draft_ms``,
``verify_ms``, ``offered`` (how many tokens the drafter offered, where the draft
policy verified fewer), ``grade`` (where the drafter grades its drafts: ngram-mod's
1-4 for how much context before the key matched; the policy learns each grade apart),
and ``stop`` on the last step. The summary line is
``{"summary": {...}}`` with the same counters the profile prints.
"""
import json
import sys


class Tracer:
    """Writes steps to a file path, or to stderr for ``-``."""

    def __init__(self, target, vocab):
        self.vocab = vocab
        self._own = target != "-"
        self.fp = open(target, "w", encoding="utf-8") if self._own else sys.stderr

    def step(self, s):
        """Record one :class:`~geniex.engine.loop.Step`."""
        rec = {
            "step": s.index, "pos": s.n_past, "last": s.pending, "method": s.method,
            "drafted": list(s.drafted),
            "target": s.target, "accepted": s.accepted, "committed": s.committed,
            "text": self.vocab.detokenize(s.committed),
            "draft_ms": round(s.draft_time * 1000, 3), "verify_ms": round(s.verify_time * 1000, 3),
        }
        if s.draft_probs is not None:
            rec["draft_probs"] = [round(p, 4) for p in s.draft_probs]
        if s.extra:
            rec.update(s.extra)       # "offered" (draft tokens the policy left unverified), "grade"
        if s.stop:
            rec["stop"] = s.stop
        self.fp.write(json.dumps(rec) + "\n")

    def summary(self, stats):
        """The closing line with the answer's counters."""
        self.fp.write(json.dumps({"summary": stats.to_dict()}) + "\n")
        self.fp.flush()

    def close(self):
        if self._own:
            self.fp.close()
