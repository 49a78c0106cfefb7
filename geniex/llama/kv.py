"""KV-cache bookkeeping shared by the target and the drafters' own contexts.

Both the engine (the target's cache across answers) and the model drafters (a draft
model's cache following the committed history) keep a list of the tokens their KV
cache holds and bring it up to date the same way: keep the longest shared prefix,
trim the rest, decode what is new in batch-sized chunks.
"""
from geniex.errors import Cancelled


def common_prefix(a, b, start=0):
    """Length of the shared prefix of two token lists, ``start`` being known to match."""
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


# Rows of a prompt decoded per llama_decode call (at most), as llama.cpp's server decodes
# them (its default micro-batch): each call reads the weights once, so a 128-row call
# read a 1,600-token prompt at 0.74x the speed of 512-row calls on the 2-core VM. A prompt
# whose client went away stops within one chunk, and progress is reported per chunk (a
# 512-row chunk of the 135M demo model takes about 2 s there; a larger model longer).
# With an F16 cache the context's micro-batch is 32 rows, and llama_decode cuts a call
# into the same micro-batches however long it is, so the KV cache holds the same bits.
PROMPT_CHUNK = 512


def prefill(ctx, batch, tokens, start, end, cancel=None, progress=None, on_rows=None):
    """Decode ``tokens[start:end]`` in chunks of :data:`PROMPT_CHUNK` rows (rounded to
    the context's micro-batch), or of its batch size where that is smaller.

    Returns the batch row of the last decoded token (its output is on), or None when
    nothing was decoded. ``cancel()`` is checked before each chunk: a long prompt whose
    client went away stops there with :class:`~geniex.errors.Cancelled` (the positions
    decoded so far are trimmed by the next :meth:`KvHistory.sync`). ``progress(pos)`` is
    called after each chunk with the positions now in the cache.
    """
    row = None
    pos = start
    step = min(ctx.n_batch, batch.capacity)
    if step > PROMPT_CHUNK:
        step = min(step, max(PROMPT_CHUNK // ctx.n_ubatch, 1) * ctx.n_ubatch)
    while pos < end:
        if cancel is not None and cancel():
            raise Cancelled(pos - start, end - start)
        n = min(step, end - pos)
        ctx.decode(batch.fill(tokens[pos:pos + n], pos, all_logits=on_rows is not None))
        if on_rows is not None:
            on_rows(ctx.logits, pos, n)
        row = n - 1
        pos += n
        if progress is not None:
            progress(pos)
    return row


class KvHistory:
    """The tokens a context's KV cache holds at positions 0..len-1, for reuse between
    answers (a follow-up prompt decodes only what is new)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.tokens = []

    def sync(self, tokens, keep_at_most):
        """Keep the longest cached prefix of ``tokens`` (at most ``keep_at_most``), drop
        the rest of the cache, and return how many positions were kept."""
        keep = min(common_prefix(self.tokens, tokens), keep_at_most)
        if not self.ctx.try_trim(keep):
            # A recurrent state cannot go back that far: start this prompt from scratch.
            self.ctx.clear()
            keep = 0
        del self.tokens[keep:]
        return keep

    def fill(self, batch, tokens, start, end, cancel=None, progress=None, on_rows=None):
        """Decode ``tokens[start:end]`` after :meth:`sync` kept ``start`` of them, as
        :func:`prefill` does (a history whose prompts another context reads does that).
        ``on_rows(logits, pos, n)``, if given, hears each chunk's rows (logits on every
        row: ``logits(i)`` is position ``pos + i``'s)."""
        return prefill(self.ctx, batch, tokens, start, end, cancel, progress, on_rows)

    def reset(self):
        """Forget everything: the next prompt is decoded from scratch."""
        self.ctx.clear()
        self.tokens = []

    def behind(self):
        """Whether :meth:`catch_up` has work (a history whose prompts another context
        reads: geniex.engine.prompt_reader)."""
        return False

    def catch_up(self, cancel=None):
        """Nothing here (see :meth:`behind`)."""

    def reading(self):
        """How many prompt reads run now in the context that reads this history's
        prompts (none: the target decodes its own, in the slots' shared decodes)."""
        return 0

    def snapshot(self):
        """The cache's conversation as a value for a prompt cache (``len()`` is its bytes)."""
        return self.ctx.save_state()

    def restore(self, snapshot, tokens):
        """Put back a :meth:`snapshot` holding ``tokens``; False if the library refused it
        (the cache is then empty)."""
        if not self.ctx.load_state(snapshot):
            self.tokens = []
            return False
        self.tokens = list(tokens)
        return True
