"""``draft-mtp`` with the NextN (MTP) layers bundled in the target GGUF (Qwen3.5 style).

The target is loaded with ``load_mtp``; the draft context is a second, MTP-type context
on the *same* model. Unlike the Gemma-4 assistant it has a KV cache of its own (one
layer: the NextN block), so it must hold a row for every committed position: the row at
position ``p`` pairs token ``history[p]`` with the target's hidden state at ``p - 1``
(upstream common/speculative.cpp, ``draft-mtp`` without shared memory).

Per step: after every target decode (prompt, verify) the drafter catches its KV up to
the target's committed positions from the target's nextn rows (a row per batch token),
dropping whatever it drafted past them; ``propose`` then decodes the pending token at
``n_past`` with the target's last hidden state, and each proposal at the next position
with the draft's own output state (positions advance; the KV is trimmed back at the
next catch-up).

Hidden states the drafter never saw (prompt chunks before the last one, a conversation
prefix reused from an earlier answer whose last row is gone) are paired as zeros: the
drafts get worse there, the output does not change (the target verifies everything).
"""
import numpy as np

from geniex.errors import SpecSetupError
from geniex.llama import api
from geniex.llama.objects import Batch
from geniex.speculative.drafters.mtp import HiddenStateDrafter


class NextnDrafter(HiddenStateDrafter):
    """Multi-token prediction with the target's own NextN block."""

    name = "draft-mtp"

    def __init__(self, target, n_max, n_min, p_min):
        super().__init__(n_max, n_min, p_min)
        target.ctx.require_nextn()
        model = target.model
        if model.n_layer_nextn() < 1:
            raise SpecSetupError(f"{target.name} was loaded without its NextN layers")
        if model.n_embd_out != model.n_embd:
            raise SpecSetupError(f"{target.name}: NextN row width {model.n_embd_out} differs "
                                 f"from the model width {model.n_embd}")
        self.target = target.ctx
        tp = target.ctx.params
        self.cap_batch = self.most = 512
        self.ctx = target.new_context(model, n_batch=self.cap_batch, n_ubatch=tp.n_ubatch,
                                      ctx_type=api.LLAMA_CONTEXT_TYPE_MTP, n_seq_max=tp.n_seq_max)
        self.target.stage_nextn(True, False)       # a row per batch token
        self.ctx.stage_nextn(True, True)           # rows for output tokens
        self.width = model.n_embd_out
        self.seq = target.seq                      # its rows go to the target slot's sequence
        self.batch = Batch(self.cap_batch, n_embd=self.width, seq=self.seq)
        self._h = self.batch.embd[0]               # draft row 0's hidden-state slot
        self.kv_tokens = []      # tokens at draft KV positions 0..len-1 (committed only)
        self.h_last = np.zeros(self.width, dtype=np.float32)
        self.h_pos = -1          # target position h_last belongs to (-1: none)

    # -- catching the draft KV up with the target ------------------------------------
    def _target_rows(self, n):
        """The target's first ``n`` nextn rows of its last batch, as a numpy copy."""
        out = np.empty((n, self.width), dtype=np.float32)
        for i in range(n):
            if not self.target.copy_nextn_row(i, out[i]):
                raise SpecSetupError(f"the target has no NextN row {i}")
        return out

    def _catch_up(self, history, n_past, target_row):
        keep = 0
        limit = min(len(self.kv_tokens), n_past)
        while keep < limit and self.kv_tokens[keep] == history[keep]:
            keep += 1
        h_ok = 0 <= self.h_pos < keep
        self.ctx.trim(keep, self.seq)
        del self.kv_tokens[keep:]
        if target_row is None:
            start, rows = n_past, None
        else:
            start = n_past - 1 - target_row          # the target batch's first position
            rows = self._target_rows(target_row + 1)
        b = self.batch
        pos = keep
        while pos < n_past:
            n = min(self.cap_batch, n_past - pos)
            for j in range(n):
                p = pos + j
                q = p - 1                            # the hidden state this row pairs with
                if rows is not None and q >= start:
                    b.embd[j] = rows[q - start]
                elif h_ok and q == self.h_pos:
                    b.embd[j] = self.h_last
                else:
                    b.embd[j] = 0.0
            b.tokens[:n] = history[pos:pos + n]
            b.pos[:n] = np.arange(pos, pos + n, dtype=np.int32)
            b.logits[:n] = 0
            b.struct.n_tokens = n
            self.ctx.decode(b)
            pos += n
        self.kv_tokens[keep:] = history[keep:n_past]
        if rows is not None and n_past - 1 >= start:
            self.h_last[:] = rows[n_past - 1 - start]
            self.h_pos = n_past - 1
        elif not (h_ok and self.h_pos == n_past - 1):
            self.h_pos = -1

    def begin(self, history, n_past, target_row):
        self._catch_up(history, n_past, target_row)

    def observe(self, history, n_past, target_row, drafted, accepted):
        self._catch_up(history, n_past, target_row)

    # -- drafting ----------------------------------------------------------------------
    def start(self, history, n_past):
        if self.h_pos != n_past - 1 or len(self.kv_tokens) != n_past:
            return False
        self.ctx.trim(n_past, self.seq)                      # drafts of an earlier propose
        b = self.batch
        b.tokens[0] = history[n_past]
        b.pos[0] = n_past
        b.logits[0] = 1
        self._h[:] = self.h_last
        b.struct.n_tokens = 1
        self.ctx.decode(b)
        return True
