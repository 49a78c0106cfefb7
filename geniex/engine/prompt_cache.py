"""Conversations that left the context, kept in host memory (``geniex serve
--cache-ram``), so an agent that comes back after another spoke pays only for its new
tokens.

When a prompt arrives whose longest cached prefix is in a saved conversation rather than
in the context, the context's conversation is saved here and the saved one put back
(llama_state_seq_get_data / set_data), least recently used out past the byte bound.
Every entry belongs to an owner (the API key a request came with): a prompt is only ever
matched against its own owner's conversations.

With a quantized KV cache a state holds the same bits a fresh prefill of its tokens
writes (the cache's rows do not depend on batch shape: geniex.llama.cache_types
.shape_free), so an answer does not depend on what was cached before.
"""
import collections
import logging
import threading
from dataclasses import dataclass

from geniex.llama.kv import common_prefix

log = logging.getLogger("geniex.engine")

MIN_TOKENS = 32    # conversations shorter than this are not worth a save or a restore


@dataclass
class Entry:
    owner: object
    tokens: list
    state: bytes


class PromptCache:
    """Saved conversations, at most ``capacity`` bytes of state (0: keep none)."""

    def __init__(self, capacity):
        self.capacity = capacity
        self._entries = collections.OrderedDict()     # id -> Entry, least recently used first
        self._next = 0
        self.size = 0                                 # bytes held
        self.hits = 0                                 # conversations put back
        self.saved = 0                                # conversations saved
        # Held by a session's adopt (best, save, restore as one decision): a server's
        # slots adopt their prompts from their own threads.
        self.lock = threading.RLock()

    def status(self):
        """What /slots and /metrics show: entries, bytes held and the bound, restores."""
        with self.lock:
            return {"entries": len(self._entries), "bytes": self.size, "capacity": self.capacity,
                "restored": self.hits, "saved": self.saved}

    def best(self, tokens, owner):
        """``(key, shared)``: the owner's entry sharing the longest prefix with ``tokens``,
        or ``(None, 0)``."""
        found, shared = None, 0
        for key, entry in self._entries.items():
            if entry.owner == owner:
                n = common_prefix(entry.tokens, tokens)
                if n > shared:
                    found, shared = key, n
        return found, shared

    def save(self, kv, owner):
        """Keep the conversation of ``kv`` (a KvHistory: its tokens and a snapshot of its
        cache), replacing the owner's entries it extends or repeats, and dropping the least
        recently used past the bound."""
        tokens = kv.tokens
        if self.capacity <= 0 or len(tokens) < MIN_TOKENS:
            return
        for key, e in list(self._entries.items()):
            if e.owner == owner and e.tokens == tokens:
                # Kept already (a slot saves its conversation while the server is idle:
                # Slots._settle): the same tokens hold the same cells, so a slot giving it
                # up costs nothing now. It becomes the most recently used.
                self._entries[self._next] = self._entries.pop(key)
                self._next += 1
                return
        for key in [k for k, e in self._entries.items()
                    if e.owner == owner and common_prefix(e.tokens, tokens) == len(e.tokens)]:
            self._drop(key)
        state = kv.snapshot()
        if len(state) > self.capacity:
            log.info("prompt cache: a %d-token conversation (%d MiB) is larger than --cache-ram", len(tokens),
                     len(state) >> 20)
            return
        while self.size + len(state) > self.capacity:
            self._drop(next(iter(self._entries)))
        self._entries[self._next] = Entry(owner, list(tokens), state)
        self._next += 1
        self.size += len(state)
        self.saved += 1

    def restore(self, kv, key):
        """Put entry ``key`` back into ``kv``'s cache (and out of this one); False when the
        library refused the state (the cache is then empty)."""
        entry = self._entries.pop(key)
        self.size -= len(entry.state)
        if not kv.restore(entry.state, entry.tokens):
            log.warning("prompt cache: the library refused a saved state; decoding the prompt again")
            return False
        self.hits += 1
        return True

    def _drop(self, key):
        self.size -= len(self._entries.pop(key).state)
