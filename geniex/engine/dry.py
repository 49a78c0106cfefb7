"""DRY ("don't repeat yourself"), as llama.cpp's ``dry`` sampler computes it.

A candidate token that would extend a sequence already seen in the recent context gets
its logit lowered by ``multiplier * base ** (length - allowed_length)``, where ``length``
is the longest repeat it would continue (at least ``allowed_length``). A repeat does not
reach back past the most recent sequence-breaker token, and a breaker token itself is
never penalised. Deterministic (no draw); its history moves only with sampled tokens,
which the loop commits, so speculative output stays identical.

Sequence breakers are single characters here: a token is a breaker when its text
contains one, which is llama.cpp's rule for a one-character breaker (a longer breaker,
matched there across tokens, is refused by the server).
"""
import math

import numpy as np

FLOAT_MAX_LOG = 88.7228391        # the exponent is clamped so base**exp stays a float32


class Dry:
    """The DRY stage of one answer: ``history`` (prompt and answer tokens) and the
    settings; :meth:`accept` each sampled token, :meth:`apply` to a row of logits."""

    def __init__(self, multiplier, base, allowed_length, last_n, breakers, history=()):
        self.multiplier = multiplier
        self.base = base
        self.allowed = allowed_length
        self.last_n = last_n
        self.breakers = breakers            # token ids that are sequence breakers
        self.tokens = list(history)[-last_n:]
        self.max_exp = int(FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0

    def accept(self, token):
        self.tokens.append(token)
        if len(self.tokens) > 2 * self.last_n:
            del self.tokens[:-self.last_n]

    def apply(self, x):
        """Lower ``x`` (a writable float32 row) in place; returns it."""
        w = self.tokens[-self.last_n:]
        n = len(w)
        if n <= self.allowed:
            return x
        rep_limit = n
        for i in range(n):                 # the most recent breaker bounds every repeat
            if w[n - 1 - i] in self.breakers:
                rep_limit = i
                break
        if rep_limit < self.allowed:
            return x
        arr = np.asarray(w)
        # p: the end of an earlier occurrence of the context's suffix; the token after it
        # is the one that would continue the repeat.
        ends = range(n - 1) if self.allowed <= 0 else np.nonzero(arr[:-1] == arr[-1])[0]
        longest = {}
        for p in ends:
            m = 0
            while m < rep_limit and p - m >= 0 and arr[p - m] == arr[n - 1 - m]:
                m += 1
            if m >= self.allowed:
                t = int(arr[p + 1])
                if longest.get(t, -1) < m:
                    longest[t] = m
        for t, m in longest.items():
            if t in self.breakers:
                continue
            e = m - self.allowed
            if self.max_exp > 0 and e > self.max_exp:
                e = self.max_exp
            x[t] -= self.multiplier * self.base ** e
        return x
