"""The bench's workloads: each a small module in this folder that defines ``WORKLOAD``.

A workload is a family of requests of one kind (a code edit, a passage to quote, an open
question, ...) with a pool of **different instances**: round r asks instance r, so no
round repeats a request another round asked, and what a drafter remembers from earlier
answers helps exactly as much as it would for a user. A workload whose ``kind`` is
``"replayed"`` asks the same request every round on purpose (an agent that sends the
same file again); its rows are labelled and never part of the headline.

Adding a workload is one new file here with a ``WORKLOAD = Workload(...)`` in it; the
bench finds it (:func:`load`). Kinds:

- ``"input"``: input-grounded, the answer copies spans of the prompt or of an earlier turn;
- ``"open"``: open text (prose, short and long answers), nothing in particular to copy;
- ``"replayed"``: the same request asked again (labelled rows, not the headline).
"""
import importlib
import pkgutil
from dataclasses import dataclass, field

KINDS = ("input", "open", "replayed")

@dataclass
class Instance:
    """One request of a workload, as the user's chat turns. With several turns, each
    turn is sent after the conversation so far, the previous turns' answers being what
    plain decoding answered (the same text for every configuration); every turn but the
    last is asked unmeasured (it builds the conversation and what the sides remember),
    and the last one is measured."""

    turns: list                       # user messages, in order


@dataclass
class Workload:
    """A family of requests with ``len(pool)`` different instances (see the module docstring)."""

    name: str
    kind: str                         # one of KINDS
    tokens: int                       # answer length cap of the full run
    quick_tokens: int                 # ... of --quick
    describe: str                     # one line for the report
    pool: list = field(default_factory=list)   # Instance per round
    order: int = 50                   # where it runs in a round (lower first)

    def instance(self, r):
        """The request of round ``r`` (0-based)."""
        if self.kind == "replayed":
            return self.pool[0]
        if r >= len(self.pool):
            raise ValueError(f"workload {self.name} has {len(self.pool)} different instances; "
                             f"round {r + 1} would repeat one (run fewer rounds)")
        return self.pool[r]

    @property
    def rounds(self):
        """How many rounds can ask a request no earlier round asked."""
        return 10 ** 6 if self.kind == "replayed" else len(self.pool)


def load():
    """Every workload defined in this folder, in running order."""
    out = []
    for mod in pkgutil.iter_modules(__path__):
        wl = getattr(importlib.import_module(f"{__name__}.{mod.name}"), "WORKLOAD", None)
        if wl is not None:
            if wl.kind not in KINDS:
                raise ValueError(f"workload {wl.name}: kind {wl.kind!r} is not one of {KINDS}")
            out.append(wl)
    names = [w.name for w in out]
    if len(set(names)) != len(names):
        raise ValueError(f"two workloads share a name: {names}")
    return sorted(out, key=lambda w: (w.order, w.name))
