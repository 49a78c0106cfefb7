"""Token log-probabilities of an answer, read off the target's logits of each verify row.

They are the log-softmax of the raw logits (no logit bias, penalty or sampler applied),
as llama.cpp's server reports ``n_probs`` unless ``post_sampling_probs`` is set and as
OpenAI's ``logprobs`` are described. A row is the target's own logits for that position
whether it was a one-row decode or a row of a verify batch, so the values are the same
with and without speculation (to float tolerance: docs/speculative.md, "Identical output").

Nothing here runs unless a request asks for log-probabilities: the loop calls
:meth:`Probe.row` only when the answer has a probe.
"""
from dataclasses import dataclass

import numpy as np


@dataclass
class TokenLogprob:
    """One answer token: its id and log-probability, and the ``top`` most likely tokens
    of its row as ``(id, logprob)`` pairs, most likely first (ties by id)."""

    token: int
    logprob: float
    top: tuple = ()


class Probe:
    """Reads the log-probabilities of the rows the loop samples; ``top`` alternatives per
    row (0: the sampled token's only)."""

    def __init__(self, top=0):
        self.top = int(top)
        self.rows = []              # TokenLogprob per sampled row of the current verify

    def start(self):
        """A new verify batch: forget the rows of the last one."""
        self.rows.clear()

    def row(self, logits, token):
        """Record the sampled ``token`` of one row of raw ``logits`` (the library's view)."""
        self.rows.append(read(logits, token, self.top))


def read(logits, token, top=0):
    """The :class:`TokenLogprob` of ``token`` in one row of raw logits."""
    x = np.asarray(logits, dtype=np.float32)
    m = float(x.max())
    # log-sum-exp in float64: 49k terms summed in float32 lose the small ones.
    lse = m + float(np.log(np.exp(x - m).sum(dtype=np.float64)))
    chosen = float(x[token]) - lse
    if top <= 0:
        return TokenLogprob(int(token), chosen)
    k = min(top, x.size)
    idx = np.argpartition(x, x.size - k)[x.size - k:] if k < x.size else np.arange(x.size)
    # most likely first; equal logits in id order, so the list does not depend on the partition
    idx = idx[np.lexsort((idx, -x[idx]))]
    return TokenLogprob(int(token), chosen, tuple((int(i), float(x[i]) - lse) for i in idx))
