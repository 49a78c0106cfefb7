"""``draft-mtp``: a Gemma-4 assistant drafting from the target's own hidden states.

The assistant has no KV cache of its own: its context (type MTP, ``ctx_other`` = the
target context) attends over the target's KV. So it must be created right after the
target context and before the target decodes anything, and only the target is ever
rolled back. A draft step decodes one row carrying both a token and a hidden state:
first the pending token with the target's hidden state at the previous position, then
each proposal with the assistant's own output state, all at the same position.
"""
from geniex.errors import SpecSetupError
from geniex.llama import api
from geniex.llama.objects import Batch
from geniex.speculative.drafters.base import ModelDrafter, top_choice


class HiddenStateDrafter(ModelDrafter):
    """What both MTP drafters share: a draft row carries a token and a hidden state, the
    next row's state is the draft's own output, and the proposal is the top-10 argmax."""

    reads_target_rows = True

    advances = True   # whether each draft row moves to the next position

    def score(self):
        return top_choice(self.ctx.logits(0))

    def advance(self, token, pos):
        if not self.ctx.copy_nextn_row(0, self._h):
            return False
        self.batch.tokens[0] = token
        if self.advances:
            self.batch.pos[0] = pos
        self.ctx.decode(self.batch)
        return True

    def close(self):
        self.target.stage_nextn(False, False)
        self.ctx.close()


class MtpAssistant(HiddenStateDrafter):
    """Multi-token prediction with an assistant model wired to the target context."""

    name = "draft-mtp"
    advances = False  # every draft row at the same position: the assistant reads the target's KV

    def __init__(self, target, model, n_max, n_min, p_min):
        super().__init__(n_max, n_min, p_min)
        target.ctx.require_nextn()
        if target.ctx.decoded_any:
            # The library would silently wipe the target's KV bookkeeping.
            raise SpecSetupError("the MTP draft context must be created before the target decodes anything")
        self.model = model
        self.target = target.ctx
        rows = self.most = max(64, n_max)     # (a request's own spec_n_max may not pass it)
        # n_seq_max, kv_unified, flash attention, swa_full and the KV types must match the
        # target's: new_context copies threads and cache types, n_seq_max is copied here.
        self.ctx = target.new_context(model, n_batch=rows, n_ubatch=rows,
                                      ctx_type=api.LLAMA_CONTEXT_TYPE_MTP, other=target.ctx,
                                      n_seq_max=target.ctx.params.n_seq_max)
        self.target.stage_nextn(True, False)       # a row per batch token
        self.ctx.stage_nextn(True, True)           # rows for output tokens
        # Its rows read the target slot's sequence of the target's KV.
        self.batch = Batch(rows, n_embd=target.model.n_embd_out, seq=target.seq)
        self._h = self.batch.embd[0]               # draft row 0's hidden-state slot
        self.have_h = False

    def begin(self, history, n_past, target_row):
        self.have_h = target_row is not None and self.target.copy_nextn_row(target_row, self._h)

    def observe(self, history, n_past, target_row, drafted, accepted):
        self.have_h = self.target.copy_nextn_row(target_row, self._h)

    def start(self, history, n_past):
        if not self.have_h:
            return False
        b = self.batch
        b.tokens[0] = history[n_past]
        b.pos[0] = n_past              # the target's last position + 1, for every draft row
        b.logits[0] = 1
        b.struct.n_tokens = 1
        self.ctx.decode(b)
        # The staged row is overwritten by the assistant's states from here on: the next
        # step needs the target's row again, which observe() provides.
        self.have_h = False
        return True

    def close(self):
        super().close()
        self.model.close()
