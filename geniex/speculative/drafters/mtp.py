"""``draft-mtp``: a Gemma-4 assistant drafting from the target's own hidden states.

The assistant has no KV cache of its own: its context (type MTP, ``ctx_other`` = the
target context) attends over the target's KV. So it must be created right after the
target context and before the target decodes anything, and only the target is ever
rolled back. A draft step decodes one row carrying both a token and a hidden state:
first the pending token with the target's hidden state at the previous position, then
each proposal with the assistant's own output state, all at the same position.
"""
import ctypes

import numpy as np

from geniex.errors import SpecSetupError
from geniex.llama import api
from geniex.llama.objects import Batch, Context
from geniex.speculative.drafters.base import EMPTY, Draft, Drafter

TOP_K = 10   # upstream samples the draft from the top 10 and scores it by their softmax


def top_choice(logits):
    """The most probable token and its probability within the top ``TOP_K`` (how upstream
    scores an MTP draft token against ``--draft-p-min``)."""
    top = np.argpartition(logits, -TOP_K)[-TOP_K:]
    vals = logits[top]
    j = int(np.argmax(vals))
    return int(top[j]), float(1.0 / np.exp(vals - vals[j]).sum())


class MtpDrafter(Drafter):
    """Multi-token prediction with an assistant model wired to the target context."""

    name = "draft-mtp"

    def __init__(self, session, model, n_max, p_min):
        lib = session.model._lib
        lib.require("llama_set_embeddings_nextn", "llama_get_embeddings_nextn_ith",
                    capability="MTP drafting (the hidden-state staging API)")
        if session.ctx.decoded_any:
            # The library would silently wipe the target's KV bookkeeping.
            raise SpecSetupError("the MTP draft context must be created before the target decodes anything")
        self._lib = lib
        self.model = model
        self.target = session.ctx
        cap = max(64, n_max)
        tp = session.ctx.params
        # n_seq_max, kv_unified, flash attention, swa_full and the KV types must match the
        # target's: we create both from the same defaults and copy n_seq_max explicitly.
        self.ctx = Context(model, n_ctx=session.ctx.n_ctx, n_batch=cap, n_ubatch=cap,
                           n_threads=session.threads, n_threads_batch=session.threads_batch,
                           ctx_type=api.LLAMA_CONTEXT_TYPE_MTP, other=session.ctx,
                           n_seq_max=tp.n_seq_max)
        lib.llama_set_embeddings_nextn(self.target.ptr, True, False)   # a row per batch token
        lib.llama_set_embeddings_nextn(self.ctx.ptr, True, True)       # rows for output tokens
        self.width = session.model.n_embd_out
        self.batch = Batch(cap, n_embd=self.width)
        self._row_bytes = self.width * 4
        self._h_ptr = self.batch.embd.ctypes.data      # draft row 0's embedding slot
        self.have_h = False
        self.n_max, self.p_min = n_max, p_min
        self.cap = n_max

    def _stage(self, ctx_ptr, row):
        """Copy a hidden-state row from a context into the draft batch (no allocation)."""
        src = self._lib.llama_get_embeddings_nextn_ith(ctx_ptr, row)
        if not src:
            return False
        ctypes.memmove(self._h_ptr, src, self._row_bytes)
        return True

    def begin(self, history, n_past, target_row):
        self.have_h = target_row is not None and self._stage(self.target.ptr, target_row)

    def observe(self, history, n_past, target_row, drafted, accepted):
        self.have_h = self._stage(self.target.ptr, target_row)

    def propose(self, history, n_past, n_max):
        if not self.have_h:
            return EMPTY
        b = self.batch
        b.tokens[0] = history[n_past]
        b.pos[0] = n_past              # the target's last position + 1, for every draft row
        b.logits[0] = 1
        b.struct.n_tokens = 1
        out, probs = [], []
        limit = min(n_max, self.n_max)
        for i in range(limit):
            self.ctx.decode(b)
            tok, p = top_choice(self.ctx.logits(0))
            if self.p_min > 0 and p < self.p_min:
                break
            out.append(tok)
            probs.append(p)
            if i + 1 < limit:
                b.tokens[0] = tok
                if not self._stage(self.ctx.ptr, 0):
                    break
        # The staged row was overwritten by the assistant's states: the next step needs
        # the target's row again, which observe() provides.
        self.have_h = False
        return Draft(out, probs) if out else EMPTY

    def close(self):
        if self.target.ptr:
            self._lib.llama_set_embeddings_nextn(self.target.ptr, False, False)
        self.ctx.close()
        self.model.close()
