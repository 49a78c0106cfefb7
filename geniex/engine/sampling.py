"""Token sampling in numpy, with exactly one random draw per committed token.

The sampler is ours rather than llama.cpp's chain so that the speculative loop can
sample each verify row exactly as plain decoding samples each step: same logits, same
penalty history, same position in the random stream. That is what makes seeded
speculative output identical to plain seeded output.

Order (as llama.cpp's default chain): logit bias, penalties, top-k, typical, top-p,
min-p, temperature, draw.
``temperature <= 0`` is greedy (argmax after penalties) and draws nothing.
"""
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingParams:
    """What ``infer`` flags and request fields say; 0 means unset."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 0.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0               # 0 = a fresh random seed per answer
    penalty_last_n: int = 64    # how many recent tokens the penalties look at (llama.cpp default)
    logit_bias: tuple = ()      # ((token, bias), ...) added to the logits; -inf bans a token
    ignore_eos: bool = False    # ban end-of-generation tokens (the engine turns it into biases)
    typical_p: float = 1.0      # locally typical sampling; 1 = off

    @property
    def greedy(self):
        return self.temperature <= 0

    @property
    def penalized(self):
        return (self.repetition_penalty not in (0, 1) or self.presence_penalty != 0
                or self.frequency_penalty != 0)


class Sampler:
    """Samples one token per call; :meth:`accept` feeds the penalty window."""

    def __init__(self, params, n_vocab, history=()):
        self.params = params
        seed = params.seed or time.time_ns() & 0xFFFFFFFF
        self.seed = seed
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.n_vocab = n_vocab
        self._window = []
        self._counts = np.zeros(n_vocab, dtype=np.int32) if params.penalized else None
        self._bias = None
        if params.logit_bias:
            self._bias = np.zeros(n_vocab, dtype=np.float32)
            for token, bias in params.logit_bias:
                self._bias[token] += bias
        if self._counts is not None:
            for t in list(history)[-params.penalty_last_n:]:
                self.accept(t)

    def accept(self, token):
        """Record a committed token (only the penalties need it)."""
        if self._counts is None:
            return
        self._window.append(token)
        self._counts[token] += 1
        if len(self._window) > self.params.penalty_last_n:
            self._counts[self._window.pop(0)] -= 1

    def _penalize(self, logits):
        p = self.params
        x = np.array(logits, dtype=np.float32)    # the library's buffer is read-only
        seen = np.nonzero(self._counts)[0]
        if seen.size:
            vals = x[seen]
            if p.repetition_penalty not in (0, 1):
                vals = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            vals = vals - self._counts[seen] * p.frequency_penalty - p.presence_penalty
            x[seen] = vals
        return x

    def sample(self, logits):
        """Pick a token from one row of logits (a numpy float32 view)."""
        p = self.params
        x = logits + self._bias if self._bias is not None else logits
        x = self._penalize(x) if self._counts is not None else x
        if p.greedy:
            return int(np.argmax(x))
        # Candidate set: top-k (or all), sorted by logit only when top-p needs the order.
        if 0 < p.top_k < self.n_vocab:
            idx = np.argpartition(x, -p.top_k)[-p.top_k:]
        else:
            idx = None
        cand = x[idx] if idx is not None else np.asarray(x, dtype=np.float32)
        if 0 < p.typical_p < 1:
            cand, idx = typical(cand, idx, p.typical_p)
        if 0 < p.top_p < 1 or 0 < p.min_p:
            order = np.argsort(-cand, kind="stable")
            cand = cand[order]
            idx = order if idx is None else idx[order]
            probs = np.exp(cand - cand[0])
            probs /= probs.sum()
            keep = len(probs)
            if 0 < p.top_p < 1:
                keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
            if p.min_p > 0:
                keep = min(keep, max(1, int(np.count_nonzero(probs >= p.min_p * probs[0]))))
            cand, idx = cand[:keep], idx[:keep]
        z = (cand - cand.max()) / p.temperature
        w = np.exp(z, dtype=np.float64)
        cdf = np.cumsum(w)
        r = self.rng.random() * cdf[-1]          # the one draw for this token
        j = min(int(np.searchsorted(cdf, r, side="right")), len(cdf) - 1)
        return int(idx[j]) if idx is not None else j


def typical(cand, idx, p):
    """Locally typical sampling, as llama.cpp's ``typ_p`` stage: keep the candidates whose
    surprise ``-log p`` is closest to the distribution's entropy until their probability
    adds up to more than ``p``. Returns the kept logits and their token ids (``idx``
    None = the candidates are the whole vocabulary in order). Deterministic: no draw."""
    z = cand.astype(np.float64) - cand.max()
    probs = np.exp(z)
    probs /= probs.sum()
    logp = np.log(np.maximum(probs, 1e-300))
    entropy = -(probs * logp).sum()
    order = np.argsort(np.abs(-logp - entropy), kind="stable")
    keep = int(np.searchsorted(np.cumsum(probs[order]), p, side="right")) + 1
    order = order[:min(keep, len(order))]
    ids = order if idx is None else idx[order]
    return cand[order], ids
