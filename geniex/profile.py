"""The profile printed after each answer, shared by ``infer``, ``run`` and the server.

One line by default::

    — 56.4 tok/s • 120 tok • 0.31 s first token • 19% accept —

and with ``--verbose`` the block (``draft accept`` only when drafts were made, ``draft
policy`` only when the policy verified fewer draft tokens than the drafters offered).
"""
from geniex.engine.stats import Stats


def line(stats):
    """The one-line summary."""
    parts = [f"{stats.decode_speed:.1f} tok/s", f"{stats.decode_tokens} tok",
             f"{stats.ttft:.2f} s first token"]
    if stats.drafted:
        parts.append(f"{stats.accept_rate * 100:.0f}% accept")
    return "— " + " • ".join(parts) + " —"


def block(stats):
    """The ``--verbose`` block."""
    rows = [
        f"total time:     {stats.total_time:.2f} s",
        f"ttft:           {stats.ttft:.2f} s",
        f"prompt tokens:  {stats.prompt_tokens:<8}prompt speed:   {stats.prompt_speed:.1f} tok/s"
        + (f" ({stats.prompt_reused} reused from cache)" if stats.prompt_reused else ""),
        f"decode tokens:  {stats.decode_tokens:<8}decode speed:   {stats.decode_speed:.1f} tok/s",
        f"stop reason:    {stats.stop_reason}",
    ]
    if stats.offered > stats.drafted:
        rows.append(f"draft policy:   verified {stats.drafted} of {stats.offered} offered draft tokens; "
                    f"{stats.skipped} steps verified none of their draft")
    if stats.drafted:
        rows.append(f"draft accept:   {stats.accepted}/{stats.drafted} ({stats.accept_rate * 100:.1f}%)")
        hist = " ".join(f"{n}:{c}" for n, c in enumerate(stats.accept_hist) if c)
        rows.append(f"accepted/step:  {hist}   (steps: {stats.steps})")
        rows.append(f"draft time:     {stats.draft_time:.2f} s   verify time: {stats.verify_time:.2f} s")
    return "\n".join(rows)


def render(stats, verbose=False):
    """The block with ``verbose``, else the line."""
    return block(stats) if verbose else line(stats)


# The Stats fields that travel in a server response's ``timings`` (llama.cpp's names where
# it has one): (key, Stats attribute, ms). :func:`timings` writes them and
# :func:`from_usage` reads them back, so ``geniex run`` prints what ``infer`` prints;
# a new Stats field the profile shows needs a row here and nothing else. ``ms``: seconds
# in Stats, milliseconds in ``timings``.
CARRIED = (
    ("cache_n", "prompt_reused", False),
    ("prompt_ms", "prompt_time", True),
    ("predicted_n", "decode_tokens", False),
    ("predicted_ms", "decode_time", True),
    ("draft_n", "drafted", False),
    ("draft_n_accepted", "accepted", False),
    ("ttft_ms", "ttft", True),
    ("total_ms", "total_time", True),
    ("stop_reason", "stop_reason", False),
    ("steps", "steps", False),
    ("accept_hist", "accept_hist", False),
    ("draft_offered", "offered", False),
    ("draft_skipped_steps", "skipped", False),
    ("draft_ms", "draft_time", True),
    ("verify_ms", "verify_time", True),
)


def timings(stats):
    """llama.cpp-style ``timings`` for a server response (:data:`CARRIED`, plus the
    prompt count and the speeds llama.cpp's clients read)."""
    out = {"prompt_n": stats.prompt_tokens - stats.prompt_reused,
           "prompt_per_second": stats.prompt_speed, "predicted_per_second": stats.decode_speed}
    for key, attr, ms in CARRIED:
        value = getattr(stats, attr)
        out[key] = value * 1000 if ms else list(value) if isinstance(value, list) else value
    return out


def from_usage(usage):
    """Rebuild Stats from a server response's ``usage`` (with its ``timings``), so that
    ``geniex run`` prints exactly what ``infer`` prints. Without ``timings`` the counts
    come from OpenAI's fields."""
    timings = usage.get("timings") or {}
    details = usage.get("completion_tokens_details") or {}
    s = Stats(prompt_tokens=usage.get("prompt_tokens", 0), decode_tokens=usage.get("completion_tokens", 0))
    s.accepted = details.get("accepted_prediction_tokens") or 0
    s.drafted = s.accepted + (details.get("rejected_prediction_tokens") or 0)
    for key, attr, ms in CARRIED:
        if key in timings:
            value = timings[key]
            setattr(s, attr, value / 1000 if ms else list(value) if isinstance(value, list) else value)
    return s
