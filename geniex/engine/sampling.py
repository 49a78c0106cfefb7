"""Token sampling in numpy, with exactly one random draw per committed token.

The sampler is ours rather than llama.cpp's chain so that the speculative loop can
sample each verify row exactly as plain decoding samples each step: same logits, same
penalty history, same position in the random stream. That is what makes seeded
speculative output identical to plain seeded output.

Order (as llama.cpp's default chain): logit bias, penalties, DRY, top-n-sigma, top-k,
typical, top-p, min-p, XTC, temperature (dynamic with ``dynatemp_range``), draw.
``temperature <= 0`` without a dynamic range is greedy (argmax after penalties) and draws
nothing (XTC, when on, still draws its chance).
``mirostat`` 1 or 2 replaces the chain after the logit bias, as llama.cpp's does:
temperature, then Mirostat's own truncation and draw.

State that depends on the answer so far (the penalty window, Mirostat's ``mu``) moves
only with sampled tokens, and the loop samples a verify row only while the rows before
it were accepted: every sampled token is committed (or ends the answer), so nothing has
to be rolled back after a rejected draft.
"""
import time
from dataclasses import dataclass

import numpy as np

from geniex.engine.dry import Dry


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
    xtc_probability: float = 0.0  # exclude top choices: the chance per token; 0 = off
    xtc_threshold: float = 0.1    # ... of the tokens at least this likely (> 0.5 = off)
    mirostat: int = 0           # 1 or 2: Mirostat (v1, v2) instead of the chain
    mirostat_tau: float = 5.0   # target surprise (bits)
    mirostat_eta: float = 0.1   # learning rate of mu
    dry_multiplier: float = 0.0   # DRY repetition penalty (geniex.engine.dry); 0 = off
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # tokens DRY looks back over; -1 = the context (the caller sets it)
    dry_sequence_breakers: tuple = ("\n", ":", "\"", "*")   # single characters (llama.cpp's defaults)
    dry_breakers: frozenset = frozenset()   # the token ids whose text holds one (the engine sets them)
    top_n_sigma: float = -1.0   # keep the logits within n standard deviations of the top one; <= 0 = off
    dynatemp_range: float = 0.0     # dynamic temperature: temperature +- this, by the candidates' entropy
    dynatemp_exponent: float = 1.0  # ... the normalised entropy raised to this

    @property
    def greedy(self):
        # A dynamic range samples even around temperature 0 (from 0 to the range), as
        # llama.cpp's temp_ext does.
        return self.temperature <= 0 and self.dynatemp_range <= 0

    @property
    def dry(self):
        return self.dry_multiplier > 0 and self.dry_base >= 1 and self.dry_penalty_last_n > 0

    @property
    def xtc(self):
        return self.xtc_probability > 0 and self.xtc_threshold <= 0.5

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
        self._dry = None
        self._counts = np.zeros(n_vocab, dtype=np.int32) if params.penalized else None
        self._bias = None
        if params.logit_bias:
            self._bias = np.zeros(n_vocab, dtype=np.float32)
            for token, bias in params.logit_bias:
                self._bias[token] += bias
        if self._counts is not None:
            for t in list(history)[-params.penalty_last_n:]:
                self.accept(t)
        self.mu = 2 * params.mirostat_tau       # Mirostat's running surprise bound
        if params.dry:
            self._dry = Dry(params.dry_multiplier, params.dry_base, params.dry_allowed_length,
                            params.dry_penalty_last_n, params.dry_breakers, history)

    def accept(self, token):
        """Record a committed token (the penalties and DRY need it)."""
        if self._dry is not None:
            self._dry.accept(token)
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
        if p.mirostat:
            return self._mirostat(x)
        x = self._penalize(x) if self._counts is not None else x
        if self._dry is not None:
            x = self._dry.apply(np.array(x, dtype=np.float32))
        if p.greedy and not p.xtc:
            return int(np.argmax(x))
        if p.top_n_sigma > 0:
            x = top_n_sigma(x, p.top_n_sigma)
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
        if p.xtc:
            cand, idx = xtc(cand, idx, p.xtc_probability, p.xtc_threshold, self.rng)
        if p.greedy:
            j = int(np.argmax(cand))
            return int(idx[j]) if idx is not None else j
        z = cand - cand.max()
        t = dynamic_temperature(z, p) if p.dynatemp_range > 0 else p.temperature
        if t <= 0:              # a dynamic temperature of 0: the top candidate (no draw to divide by)
            self.rng.random()   # the answer's one draw per token is still taken
            j = int(np.argmax(cand))
            return int(idx[j]) if idx is not None else j
        z = z / t
        w = np.exp(z, dtype=np.float64)
        cdf = np.cumsum(w)
        r = self.rng.random() * cdf[-1]          # the one draw for this token
        j = min(int(np.searchsorted(cdf, r, side="right")), len(cdf) - 1)
        return int(idx[j]) if idx is not None else j

    def _mirostat(self, x):
        """Mirostat as llama.cpp's chain runs it (temperature, then v1 or v2): keep the
        likeliest tokens whose surprise stays within ``mu``, draw, and move ``mu`` toward
        ``tau`` by the draw's surprise. Greedy (temperature <= 0) keeps the top token only."""
        p = self.params
        if p.greedy:
            tok = int(np.argmax(x))
            self.mu -= p.mirostat_eta * (0.0 - p.mirostat_tau)     # the top token alone: surprise 0
            return tok
        z = np.asarray(x, dtype=np.float64) / p.temperature
        order = np.argsort(-z, kind="stable")
        probs = np.exp(z[order] - z[order[0]])
        probs /= probs.sum()
        if p.mirostat == 1:
            keep = _mirostat_v1_k(probs, self.mu, len(probs))
        else:
            # v2: drop every token from the first whose surprise exceeds mu (at least one stays)
            over = np.nonzero(-np.log2(probs) > self.mu)[0]
            keep = max(1, int(over[0]) if over.size else len(probs))
        kept = probs[:keep] / probs[:keep].sum()
        cdf = np.cumsum(kept)
        r = self.rng.random() * cdf[-1]          # the one draw for this token
        j = min(int(np.searchsorted(cdf, r, side="right")), keep - 1)
        self.mu -= p.mirostat_eta * (-np.log2(kept[j]) - p.mirostat_tau)
        return int(order[j])


def _mirostat_v1_k(probs, mu, n_vocab, m=100):
    """Mirostat v1's top-k: the Zipf exponent estimated from the ``m`` likeliest tokens
    (``probs`` sorted, descending) and the k that makes the expected surprise ``mu``."""
    n = min(m - 1, len(probs) - 1)
    i = np.arange(n, dtype=np.float64)
    t = np.log((i + 2) / (i + 1))
    b = np.log(np.maximum(probs[:n], 1e-300) / np.maximum(probs[1:n + 1], 1e-300))
    s_hat = float((t * b).sum() / (t * t).sum()) if n > 0 else 1.0
    eps = s_hat - 1
    if abs(eps) < 1e-12 or s_hat <= 0:
        return len(probs)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        k = ((eps * 2.0 ** mu) / (1 - float(n_vocab) ** (-eps))) ** (1 / s_hat)
    if not np.isfinite(k):
        return len(probs)
    return int(min(max(int(k), 1), len(probs)))


def xtc(cand, idx, probability, threshold, rng):
    """Exclude top choices, as llama.cpp's ``xtc`` stage: with chance ``probability``
    (one draw, when there are two candidates or more), drop every candidate at least
    ``threshold`` likely except the least likely of them. Returns the kept logits and
    their token ids (``idx`` None = the whole vocabulary in order)."""
    if len(cand) < 2:
        return cand, idx
    if rng.random() > probability:
        return cand, idx
    order = np.argsort(-cand, kind="stable")
    z = cand[order].astype(np.float64)
    probs = np.exp(z - z[0])
    probs /= probs.sum()
    last = int(np.count_nonzero(probs >= threshold)) - 1   # sorted: the above-threshold ones lead
    if last <= 0:
        return cand, idx
    order = order[last:]
    return cand[order], (order if idx is None else idx[order])


def top_n_sigma(x, n):
    """llama.cpp's ``top_n_sigma`` stage: logits below the top one minus ``n`` standard
    deviations (both over the finite logits) become -inf; they stay candidates with no
    weight, as in llama.cpp's array."""
    finite = x[np.isfinite(x)]
    if finite.size <= 1:
        return x
    cut = float(finite.max()) - n * float(finite.std(dtype=np.float64))
    return np.where(x < cut, np.float32(-np.inf), x).astype(np.float32, copy=False)


def dynamic_temperature(z, p):
    """llama.cpp's ``temp_ext`` (dynamic temperature): from ``max(0, t - range)`` at zero
    entropy to ``t + range`` at the candidates' maximum entropy (log of their count),
    along the normalised entropy raised to ``dynatemp_exponent``. ``z`` are the
    candidates' logits less their maximum; one candidate keeps ``t``."""
    n = len(z)
    if n <= 1:
        return p.temperature
    w = np.exp(z.astype(np.float64))
    probs = w / w.sum()
    nz = probs[probs > 0]
    entropy = float(-(nz * np.log(nz)).sum())
    low, high = max(0.0, p.temperature - p.dynatemp_range), p.temperature + p.dynatemp_range
    return low + (high - low) * (entropy / np.log(n)) ** p.dynatemp_exponent


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
