"""What a drafter may know about the target: a narrow handle, not the Session.

Drafters read the target's context (MTP reads its KV and hidden states), its model
(headers, widths, NextN layers), its vocabulary, and the settings every context of one
answer must share (threads, KV cache types), so a draft context is made exactly like
the target's through :meth:`Target.new_context`.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """The target model's handle for drafters."""

    name: str                  # as the user named the model (for messages)
    model: object              # geniex.llama.objects.Model
    ctx: object                # geniex.llama.objects.Context
    threads: int               # one-row decodes
    threads_batch: int         # multi-row batches
    ngl: int                   # layers to offload (a draft model follows the target)
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"

    @property
    def vocab(self):
        return self.model.vocab

    @property
    def seq(self):
        """The target's sequence a drafter works for (a server slot's; 0 alone)."""
        return getattr(self.ctx, "seq", 0)

    def new_context(self, model, **kw):
        """A context on ``model`` (the draft's or the target's own) with the target's
        context length, threads and KV cache types; ``kw`` adds batch sizes, type,
        ``other``... Every drafter's context is made here, so none can drift from the
        settings that keep output identical."""
        from geniex.llama.objects import Context
        # A context with the target's sequences (an MTP one) spans all of them, as the
        # target's does; a draft model's own context holds one slot's conversation.
        whole = kw.get("n_seq_max", 1) > 1
        kw.setdefault("n_ctx", getattr(self.ctx, "n_ctx_all", self.ctx.n_ctx) if whole else self.ctx.n_ctx)
        # A draft model's own cache may take another type (its cells shape guesses only);
        # a context reading the target's KV (MTP) must take the target's.
        kw.setdefault("type_k", self.cache_type_k)
        kw.setdefault("type_v", self.cache_type_v)
        return Context(model, n_threads=self.threads, n_threads_batch=self.threads_batch, **kw)
