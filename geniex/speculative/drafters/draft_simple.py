"""``draft-simple``: a separate, smaller model with its own context and KV cache."""
import numpy as np

from geniex.llama.kv import common_prefix, prefill
from geniex.llama.objects import Batch
from geniex.speculative.drafters.base import ModelDrafter


class DraftSimple(ModelDrafter):
    """Greedy drafting with a second model that tokenizes like the target.

    The draft's KV cache follows the committed history: before each proposal it keeps
    the longest prefix it shares with the history, drops its rejected drafts, and
    decodes what the target committed since.
    """

    name = "draft-simple"
    continues = True      # start() syncs the draft cache to whatever history it is given

    def __init__(self, target, model, n_max, n_min, p_min):
        super().__init__(n_max, n_min, p_min)
        self.model = model
        # The draft reads the prompt in 512-row calls from an F16 cache, the fastest way
        # (ggml-cpu's tiled attention kernel, geniex.engine.prompt_reader): its cells only
        # shape its guesses, never the answer, so they need not be the target's bits.
        rows = self.most = max(512, n_max)
        self.ctx = target.new_context(model, n_batch=rows, n_ubatch=rows, type_k="f16", type_v="f16")
        self.batch = Batch(rows)
        self.kv = []
        self.trusted = 0      # kv[:trusted] is known to equal the history
        self.row = 0          # batch row of the draft's last decode

    def begin(self, history, n_past, target_row):
        self.trusted = 0      # a new answer: the cache is synced (lazily) in start()

    def start(self, history, n_past):
        # Keep what the draft KV shares with the history; decode at least the pending token.
        keep = min(common_prefix(self.kv, history, self.trusted), n_past)
        self.ctx.trim(keep)
        self.row = prefill(self.ctx, self.batch, history, keep, n_past + 1)
        self.kv = history[:n_past + 1]
        self.trusted = n_past + 1
        return True

    def tentative(self, committed):
        self.trusted = min(self.trusted, committed)     # the forced run may yet be rejected

    def score(self):
        x = self.ctx.logits(self.row)
        tok = int(np.argmax(x))
        return tok, float(1.0 / np.exp(x - x[tok]).sum())

    def advance(self, token, pos):
        self.ctx.decode(self.batch.fill([token], pos))
        self.kv.append(token)
        self.row = 0
        return True

    def close(self):
        self.ctx.close()
        self.model.close()
