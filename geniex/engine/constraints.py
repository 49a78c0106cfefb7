"""Constrained decoding: a grammar limits which tokens each sampled row may take.

Built on llguidance (the library llama.cpp itself offers as a grammar backend): GBNF,
JSON schema, any JSON object, Lark and regular expressions compile to one grammar, and a
per-answer matcher gives the allowed-token mask of its state in microseconds, consumes
sampled tokens, rolls back, and knows which tokens the grammar allows exactly one way.

The API (what the loop, the drafters, the CLI and the server use)::

    grammar = Grammar.parse("gbnf", 'root ::= "yes" | "no"', param="grammar")  # GrammarError on bad input
    grammar = Grammar.parse("json_schema", {"type": "object", ...})     # or a JSON string
    grammar = Grammar.parse("json_object")                               # any JSON object
    grammar = Grammar.parse("lark", 'start: /[0-9]+/')                   # also "regex"

    c = grammar.constraint(vocab)   # a Constraint: one answer's matcher (vocab: llama.objects.Vocab)
    row = c.mask(logits)            # logits with -inf on every token the state forbids
    c.consume(token)                # advance the state by a sampled token (False: not allowed)
    c.rollback(n)                   # undo the last n consumed tokens
    c.forced_tokens()               # tokens the grammar allows exactly one way from here
    c.forced_text()                 # the bytes it allows exactly one way (may end mid-token)
    c.allowed_prefix(tokens)        # how many of ``tokens`` the state accepts in a row
    c.is_accepting()                # the text so far is a complete match (an end token may follow)
    c.is_stopped()                  # nothing but an end token may follow

A :class:`Grammar` is plain data (kind, source, compiled text): it crosses to the
server's worker process and is compiled against a model's vocabulary there. Syntax
errors are found without a model (:meth:`Grammar.parse`), so the server answers them
with a 400 naming the field before a model is loaded.

End tokens: every end-of-generation token of the vocabulary is an end token of the
grammar, allowed once the text matches and forced once the grammar is complete, so an
answer ends when the grammar accepts and the model ends, or when nothing else may follow.
"""
import json
import threading

import numpy as np

from geniex.errors import UsageError, shown
from geniex.llama.api import LLAMA_TOKEN_ATTR_CONTROL, LLAMA_TOKEN_ATTR_USER_DEFINED

KINDS = ("gbnf", "json_schema", "json_object", "lark", "regex")

# Building llguidance's tokenizer reads every token (~0.5 s on a 50k vocabulary), so a
# model builds it once: it is kept on the Vocab object (not keyed by the C pointer, which
# a model loaded after this one is freed may reuse).
_lock = threading.Lock()


class GrammarError(UsageError):
    """A grammar or schema that does not compile: a 400 naming ``param`` in the server,
    a usage error in the CLI."""


def _llg():
    import llguidance           # imported on first use: plain decoding never needs it
    return llguidance


class Grammar:
    """A compiled grammar (llguidance's text form), not yet bound to a vocabulary."""

    __slots__ = ("kind", "source", "text", "param")

    def __init__(self, kind, source, text, param=None):
        self.kind, self.source, self.text, self.param = kind, source, text, param

    def __repr__(self):
        return f"Grammar({self.kind}, {shown(self.source, 60)!r})"

    def __eq__(self, other):
        return isinstance(other, Grammar) and (self.kind, self.text) == (other.kind, other.text)

    def __hash__(self):
        return hash((self.kind, self.text))

    def __getstate__(self):
        return (self.kind, self.source, self.text, self.param)

    def __setstate__(self, state):
        self.kind, self.source, self.text, self.param = state

    @classmethod
    def parse(cls, kind, source=None, param=None):
        """Compile ``source`` of ``kind`` (one of :data:`KINDS`); ``param`` names the
        request field or flag it came from, for the error. Raises GrammarError."""
        llg = _llg()
        where = param or kind
        if kind not in KINDS:
            raise GrammarError(f"{where}: unknown grammar kind {kind!r} (one of {', '.join(KINDS)})", param=param)
        if kind == "json_object":
            source = {"type": "object"}
        if kind in ("json_schema", "json_object"):
            if isinstance(source, str):
                try:
                    source = json.loads(source)
                except ValueError as e:
                    raise GrammarError(f"{where}: the JSON schema is not valid JSON: {e}", param=param) from None
            if isinstance(source, bool):
                source = {} if source else {"not": {}}
            if not isinstance(source, dict):
                raise GrammarError(f"{where}: a JSON schema must be an object, got {type(source).__name__}",
                                   param=param)
            try:
                text = llg.LLMatcher.grammar_from_json_schema(source, defaults={"whitespace_flexible": False})
            except (ValueError, TypeError) as e:
                raise GrammarError(f"{where}: invalid JSON schema: {shown(e, 300)}", param=param) from None
            source = json.dumps(source, sort_keys=True)
        else:
            if not isinstance(source, str) or not source.strip():
                raise GrammarError(f"{where}: expected a non-empty {kind} grammar", param=param)
            try:
                text = llg.grammar_from(kind, source)
            except ValueError as e:
                raise GrammarError(f"{where}: invalid {kind} grammar: {shown(e, 300)}", param=param) from None
        problem = llg.LLMatcher.validate_grammar(text)
        if problem:
            raise GrammarError(f"{where}: invalid {_NAMES[kind]}: {shown(problem.strip(), 300)}", param=param)
        return cls(kind, source, text, param)

    def constraint(self, vocab):
        """A fresh :class:`Constraint` (the grammar's start state) on ``vocab``."""
        return Constraint(self, tokenizer(vocab), vocab.n_tokens)


_NAMES = {"gbnf": "GBNF grammar", "json_schema": "JSON schema", "json_object": "JSON object grammar",
          "lark": "Lark grammar", "regex": "regular expression"}


def tokenizer(vocab):
    """llguidance's view of a model's vocabulary, built once per vocabulary from our
    bindings: each token's bytes (control tokens marked with a 0xFF prefix, as llama.cpp's
    own llguidance backend marks them, so a grammar never matches them as text), every
    end-of-generation token as an end token, and the library's ``llama_tokenize`` for
    the grammar's own tokenizing (forced tokens)."""
    with _lock:
        found = getattr(vocab, "_llg_tokenizer", None)
        if found is not None:
            return found
        tokens = []
        for t in range(vocab.n_tokens):
            piece = vocab.piece(t)
            attr = vocab.attr(t)
            if attr & LLAMA_TOKEN_ATTR_CONTROL or (attr & LLAMA_TOKEN_ATTR_USER_DEFINED
                                                   and piece.startswith(b"<") and piece.endswith(b">")):
                piece = b"\xff" + piece
            tokens.append(piece)
        eos = [vocab.eos] if vocab.eos in vocab.eog else []
        eos += sorted(vocab.eog - set(eos))
        found = _llg().LLTokenizer.from_llamacpp(tokens=tokens, vocab_ptr=vocab.ptr,
                                                 tokenize_fptr=vocab.tokenize_address(), eos_token=eos, slices=None)
        vocab._llg_tokenizer = found
        return found


class Constraint:
    """One answer's grammar state (see the module docstring for the API).

    The mask lives in buffers made once per answer (a bitmask, its unpacked bytes and a
    row of logits), so masking a row allocates nothing."""

    def __init__(self, grammar, tok, n_vocab):
        llg = _llg()
        self.grammar = grammar
        self.n_vocab = n_vocab
        self.matcher = llg.LLMatcher(tok, grammar.text, log_level=0)
        if self.matcher.is_error():
            raise GrammarError(f"{grammar.param or grammar.kind}: {shown(self.matcher.get_error(), 300)}",
                               param=grammar.param)
        words = (max(n_vocab, tok.vocab_size) + 31) // 32
        self._bits = np.zeros(words, dtype=np.int32)
        # Each mask bit spread over a 32-bit lane (all ones: allowed, zero: forbidden), so
        # masking a row is a few bitwise passes over its float bits (numpy's masked copies
        # and fancy indexing cost several times more).
        self._shifts = np.arange(32, dtype=np.int32)
        self._lanes = np.empty((words, 32), dtype=np.int32)
        self._tmp = np.empty(n_vocab, dtype=np.int32)
        self._row = np.empty(n_vocab, dtype=np.float32)
        self._neg_inf = np.array([-np.inf], dtype=np.float32).view(np.int32)[0]
        # The token a complete grammar ends the answer with: the first of the grammar's end tokens.
        self.end_token = tok.eos_token

    def _expand(self):
        """Compute the current state's mask into the lanes; returns them, one per token."""
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        lanes = self._lanes
        np.right_shift(self._bits[:, None], self._shifts, out=lanes)
        np.bitwise_and(lanes, 1, out=lanes)
        np.negative(lanes, out=lanes)
        return lanes.reshape(-1)[:self.n_vocab]

    def allowed(self):
        """A boolean array over the vocabulary: True where the state allows the token."""
        return self._expand() != 0

    def mask(self, logits):
        """``logits`` with -inf on every token the current state forbids (a buffer of
        this constraint, valid until the next call)."""
        lanes = self._expand()
        bits, tmp = self._row.view(np.int32), self._tmp
        np.bitwise_and(np.asarray(logits, dtype=np.float32).view(np.int32), lanes, out=bits)
        np.invert(lanes, out=tmp)
        np.bitwise_and(tmp, self._neg_inf, out=tmp)
        np.bitwise_or(bits, tmp, out=bits)
        return self._row

    def consume(self, token):
        """Advance by ``token``; False if the grammar does not allow it (the matcher is
        then in an error state: the caller checks tokens first with :meth:`allowed_prefix`)."""
        return self.matcher.consume_token(int(token))

    def rollback(self, n):
        """Undo the last ``n`` consumed tokens."""
        if n > 0:
            if not self.matcher.rollback(n):
                raise RuntimeError(f"grammar rollback of {n} failed: {self.matcher.get_error()}")

    def forced_tokens(self):
        """The tokens that follow from here whatever is sampled (the grammar allows one
        continuation only), e.g. a schema's keys and punctuation."""
        if self.matcher.is_stopped():
            return []
        return self.matcher.compute_ff_tokens()

    def forced_text(self):
        """The bytes that follow from here whatever is sampled; unlike
        :meth:`forced_tokens` they may end inside a token (a drafter tokenizes them)."""
        if self.matcher.is_stopped():
            return b""
        return self.matcher.compute_ff_bytes()

    def allowed_prefix(self, tokens):
        """How many of ``tokens``, in order, the current state accepts (state unchanged)."""
        return self.matcher.validate_tokens([int(t) for t in tokens]) if tokens else 0

    def is_accepting(self):
        return self.matcher.is_accepting()

    def is_stopped(self):
        return self.matcher.is_stopped()

    def error(self):
        return self.matcher.get_error()
