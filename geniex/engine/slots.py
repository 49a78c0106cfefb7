"""A session's slots: several conversations answered at once over one loaded model.

With ``LoadOptions.parallel`` > 1 (``geniex serve --parallel N``) the target context
holds one sequence per slot, and each answer takes a slot for its lifetime
(:meth:`Slots.seat`): the slot that holds the longest prefix of its prompt, as
llama.cpp's server picks by slot similarity, else the one idle the longest (a
conversation it pushes out goes to the prompt cache, geniex.engine.prompt_cache). The
answer then runs the one accept loop through a :class:`SlotSession`, the session as
that slot sees it; the slots' decodes are gathered into one by
:mod:`geniex.engine.batcher`.
"""
import contextlib
import copy
import functools
import logging
import threading
import time

from geniex.errors import Cancelled
from geniex.llama.kv import KvHistory, common_prefix
from geniex.llama.objects import Batch
from geniex.speculative import per_answer
from geniex.speculative import policy as policies
from geniex.speculative.drafters.base import NO_DRAFTER, Drafter


log = logging.getLogger("geniex.engine")

# Seconds without a prompt read or a request waiting for a slot before a slot reads its
# last answer in the F16 context (Slots._settle): back-to-back requests (a client's next
# within milliseconds) are not made to wait for that read.
IDLE = 0.25
SIMILARITY = 0.1    # the part of a prompt a slot must hold to be chosen for it (llama-server's default)


class Slot:
    """One sequence of the target context and what an answer on it keeps between answers:
    its KV history and owner, its drafter (the n-gram methods' memory) and policy."""

    def __init__(self, seq, view, drafter, policy, n_batch, kv=None):
        self.seq = seq
        self.ctx = view
        self.kv = kv or KvHistory(view)
        self.kv_owner = None
        self.batch = Batch(n_batch)
        self.drafter = drafter
        self.own_drafters = {}          # n-gram drafters made for requests' own setups (per_answer)
        self.own_policy = None          # the auto policy of requests asking for it on a fixed load
        self.policy = policy
        self.busy = False
        self.settling = False           # reading its last answer after it (ReadHistory.catch_up)
        self.last_used = 0.0
        self.forget = False             # drop drafts and conversation before the next answer
        self.answers = 0
        self.task = ""                  # what it answers now (for /slots)
        self.started = 0.0

    def forget_drafts(self):
        """Its drafters forget what they learned from earlier answers."""
        for d in (self.drafter, *self.own_drafters.values()):
            if d is not None:
                d.forget()

    def describe(self):
        """What ``/slots`` shows of it."""
        return {"id": self.seq, "is_processing": self.busy, "n_ctx": self.ctx.n_ctx,
                "n_past": len(self.kv.tokens), "task": self.task if self.busy else "",
                "answers": self.answers, "speculative": self.drafter is not None,
                "idle_seconds": None if self.busy or not self.last_used else
                round(time.monotonic() - self.last_used, 3)}


class OnDecodeThread(Drafter):
    """A slot's drafter whose library work runs on the batcher's decode thread (under
    the model's lock): a draft context decodes on the library too, and an MTP draft
    reads the target context's KV, so no drafting may overlap the slots' shared decode
    (which waits for this slot anyway), and one thread keeps one OpenMP team busy."""

    def __init__(self, drafter, batcher):
        self.inner, self._batcher = drafter, batcher
        self.name, self.n_max, self.continues = drafter.name, drafter.n_max, drafter.continues
        self.reads_target_rows = drafter.reads_target_rows

    def limit(self, room):
        return self.inner.limit(room)

    def begin(self, history, n_past, target_row):
        self._batcher.call(self.inner.begin, history, n_past, target_row)

    def propose(self, history, n_past, room):
        return self._batcher.call(self.inner.propose, history, n_past, room)

    def observe(self, history, n_past, target_row, drafted, accepted):
        self._batcher.call(self.inner.observe, history, n_past, target_row, drafted, accepted)

    def tentative(self, committed):
        self.inner.tentative(committed)

    def forget(self):
        self.inner.forget()

    def close(self):
        self.inner.close()


class Slots:
    """The slots of a session loaded with ``parallel`` > 1."""

    def __init__(self, session, batcher, views, drafters, policy, n_batch):
        self.session = session
        self.batcher = batcher
        self.slots = []
        for seq, (view, drafter) in enumerate(zip(views, drafters)):
            if drafter is not None:
                drafter = OnDecodeThread(drafter, batcher)
            own = copy.deepcopy(policy)
            if isinstance(own, policies.GainPolicy):
                own.company = functools.partial(batcher.company, seq)
            self.slots.append(Slot(seq, view, drafter, own, n_batch, session.history(view, seq)))
        self._cond = threading.Condition()
        self._wanted = 0                # requests waiting in _take
        self._closed = False

    def __len__(self):
        return len(self.slots)

    def views(self):
        return [s.ctx for s in self.slots]

    @contextlib.contextmanager
    def seat(self, tokens, owner, reuse, what=""):
        """Take a slot for one answer to ``tokens`` asked by ``owner`` (waiting for one to
        be free) and yield the :class:`SlotSession` on it; the slot is given back after."""
        slot = self._take(tokens, owner, reuse)
        slot.task, slot.started = what, time.monotonic()
        if slot.forget:
            slot.forget = False
            slot.kv.reset()
            slot.forget_drafts()
        self.batcher.enter(slot.seq)
        try:
            yield SlotSession(self.session, slot)
        finally:
            self.batcher.leave(slot.seq)
            self._release(slot, answered=True)
            if slot.kv.behind():
                threading.Thread(target=self._settle, args=(slot,), name="geniex-catch-up", daemon=True).start()

    def _settle(self, slot):
        """Read slot ``slot``'s last answer in the F16 context (ReadHistory.catch_up) once
        no prompt has been read and no request has waited for a slot for :data:`IDLE`
        seconds, so that its conversation coming back reads only its new turn. Other
        slots may be answering meanwhile: their decodes then wait for one read call
        (their streams pause once, for well under a second on the demo model), which is
        what lets agents that take turns on one server find their conversations read
        (measured: the returning turn's first token 1.76x llama-server's when this
        waited for an idle server). Work that arrives first wins: a back-to-back request
        does not wait for the read, a request waiting for a slot or another read stops
        it before its next call (it is tried again later), and it is dropped once the
        slot answers again (its conversation is then read as it comes)."""
        answers = slot.answers

        def moved_on():
            return self._closed or slot.answers != answers

        def quiet():
            return not self._wanted and not slot.kv.reading()

        def give_way():
            return self._closed or self._wanted or slot.kv.reading() > 1
        while True:
            with self._cond:
                # reading() is the reader's count, which does not notify: look again
                # every IDLE.
                while not (moved_on() or quiet()):
                    self._cond.wait(IDLE)
                if moved_on():
                    return
            time.sleep(IDLE)
            with self._cond:
                if moved_on():
                    return
                if not quiet() or slot.busy:
                    continue
                slot.busy = slot.settling = True
            try:
                slot.kv.catch_up(give_way)
                if not give_way():
                    # Keep it in the prompt cache now, while nothing waits: a request that
                    # later takes this slot then pushes the conversation out for free
                    # (four short requests taking slots held by long conversations paid
                    # for four saves before their first tokens).
                    with self.session.prompt_cache.lock:
                        self.session.prompt_cache.save(slot.kv, slot.kv_owner)
            except Cancelled:
                continue
            except Exception:       # noqa: BLE001 - the conversation is read again when it returns
                log.warning("slot %d: reading its last answer failed", slot.seq, exc_info=True)
                slot.kv.reset()
                return
            finally:
                self._release(slot)
            return

    def _release(self, slot, answered=False):
        with self._cond:
            slot.busy = slot.settling = False
            slot.answers += answered
            slot.last_used = time.monotonic()
            self._cond.notify_all()

    def _take(self, tokens, owner, reuse):
        reuse = self.session.reuse_exact if reuse is None else reuse

        def shared(s):
            return common_prefix(s.kv.tokens, tokens) if reuse and s.kv_owner == owner else 0

        def held(s):        # whether slot s holds a real part of the prompt
            n = shared(s)
            return n and n >= SIMILARITY * len(tokens)
        with self._cond:
            # A conversation whose slot is still reading its last answer waits for it.
            self._wanted += 1
            try:
                self._cond.wait_for(lambda: any(not s.busy for s in self.slots)
                                    and not any(s.settling and held(s) for s in self.slots))
            finally:
                self._wanted -= 1
            free = [s for s in self.slots if not s.busy]
            # The slot holding most of the prompt, if that is a real part of it (as
            # llama-server's slot similarity: a shared chat-template opening is not);
            # else an empty slot; else the one idle the longest (its conversation goes
            # to the prompt cache).
            best = max(free, key=shared)
            if not held(best):
                best = min(free, key=lambda s: (bool(s.kv.tokens), s.last_used))
            slot = best
            slot.busy = True
            return slot

    def forget(self, drafts):
        """Every slot forgets its conversation (and with ``drafts`` what its drafter
        learned) before its next answer."""
        with self._cond:
            for s in self.slots:
                s.forget = s.forget or drafts
                if not s.busy:
                    s.kv.reset()
                    if drafts:
                        s.forget_drafts()
                    s.forget = False

    def status(self):
        with self._cond:
            return [s.describe() for s in self.slots]

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            # A slot reading its last answer stops before its next call; the call it is
            # in, and the cells it puts in the target, finish before the contexts go.
            self._cond.wait_for(lambda: not any(s.settling for s in self.slots))
        self.batcher.close()
        for s in self.slots:
            if s.drafter is not None:
                s.drafter.close()
                s.drafter = None


def _on_slot(name):
    """A SlotSession attribute that reads and writes its slot's (what outlives the answer)."""
    return property(lambda self: getattr(self.slot, name), lambda self, value: setattr(self.slot, name, value))


class SlotSession:
    """The session as one answer on one slot sees it: the slot's context view, KV
    history, batch, drafter and policy; everything else (model, vocabulary, options,
    the prompt cache) is the session's. Session's answering methods run on it as they
    run on a lone session."""

    def __init__(self, session, slot):
        self._session = session
        self.slot = slot
        self.ctx, self.kv, self.batch = slot.ctx, slot.kv, slot.batch
        self.drafter = slot.drafter

    def __getattr__(self, name):
        return getattr(self._session, name)

    policy = _on_slot("policy")
    own_policy = _on_slot("own_policy")
    kv_owner = _on_slot("kv_owner")

    @property
    def speculative(self):
        return self.drafter is not None

    def _prediction_policy(self):
        if isinstance(self.slot.policy, policies.FixedPolicy) and self._session.options.spec.policy == "auto":
            self.slot.policy = self._gain_policy()

    def _gain_policy(self):
        # A slot never calibrates on the shared context: the session measured its verify
        # costs at load.
        made = policies.GainPolicy(*self._session.verify_costs)
        made.company = functools.partial(self._session.batcher.company, self.slot.seq)
        return made

    def seat(self, tokens, owner, reuse, what=""):
        return contextlib.nullcontext(self)

    def _drafter_for(self, spec):
        # The loaded drafter runs on the decode thread (OnDecodeThread); so does the
        # answer's own where it is made of the loaded one's parts.
        loaded = self.drafter.inner if self.drafter is not None else None
        if spec is None:
            per_answer.restore(loaded)
            return self.drafter or NO_DRAFTER
        made = per_answer.drafter(loaded, spec, self.n_rs_seq if self.model.recurrent else None,
                                  self.slot.own_drafters)
        if made is NO_DRAFTER or loaded is None:
            return made
        return OnDecodeThread(made, self._session.batcher)


def _borrow(*names):
    from geniex.engine.session import Session
    for name in names:
        setattr(SlotSession, name, getattr(Session, name))


_borrow("adopt", "generate", "_with_prediction", "_policy_for", "reset", "tokenize_prompt")
