"""``draft-simple``: a separate, smaller model with its own context and KV cache."""
import numpy as np

from geniex.engine.loop import common_prefix, prefill
from geniex.llama.objects import Batch, Context
from geniex.speculative.drafters.base import EMPTY, Draft, Drafter


class DraftModelDrafter(Drafter):
    """Greedy drafting with a second model that tokenizes like the target.

    The draft's KV cache follows the committed history: before each proposal it keeps
    the longest prefix it shares with the history, drops its rejected drafts, and
    decodes what the target committed since.
    """

    name = "draft-simple"

    def __init__(self, session, model, n_max, p_min):
        self.model = model
        cap = max(64, n_max)     # not the target's batch: the draft decodes a few rows at a time
        self.ctx = Context(model, n_ctx=session.ctx.n_ctx, n_batch=cap, n_ubatch=min(cap, 64),
                           n_threads=session.threads, n_threads_batch=session.threads_batch)
        self.batch = Batch(cap)
        self.n_max, self.p_min = n_max, p_min
        self.cap = n_max
        self.kv = []
        self.trusted = 0      # kv[:trusted] is known to equal the history

    def begin(self, history, n_past, target_row):
        self.trusted = 0      # a new answer: the cache is synced (lazily) in propose()

    def propose(self, history, n_past, n_max):
        ctx, batch = self.ctx, self.batch
        # Keep what the draft KV shares with the history; decode at least the pending token.
        keep = min(common_prefix(self.kv, history, self.trusted), n_past)
        ctx.trim(keep)
        row = prefill(ctx, batch, history, keep, n_past + 1)
        self.kv = history[:n_past + 1]
        self.trusted = n_past + 1
        out, probs = [], []
        limit = min(n_max, self.n_max)
        pos = n_past + 1
        for i in range(limit):
            x = ctx.logits(row)
            tok = int(np.argmax(x))
            p = float(1.0 / np.exp(x - x[tok]).sum())
            if self.p_min > 0 and p < self.p_min:
                break
            out.append(tok)
            probs.append(p)
            if i + 1 < limit:
                ctx.decode(batch.fill([tok], pos))
                self.kv.append(tok)
                row = 0
                pos += 1
        return Draft(out, probs) if out else EMPTY

    def close(self):
        self.ctx.close()
        self.model.close()
