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


def from_usage(usage):
    """Rebuild Stats from a server response's ``usage`` (with its ``timings``), so that
    ``geniex run`` prints exactly what ``infer`` prints."""
    timings = usage.get("timings") or {}
    details = usage.get("completion_tokens_details") or {}
    s = Stats()
    s.prompt_tokens = usage.get("prompt_tokens", 0)
    s.decode_tokens = usage.get("completion_tokens", 0)
    s.prompt_reused = timings.get("cache_n", 0)
    s.prompt_time = timings.get("prompt_ms", 0.0) / 1000
    s.decode_time = timings.get("predicted_ms", 0.0) / 1000
    s.ttft = timings.get("ttft_ms", 0.0) / 1000
    s.total_time = timings.get("total_ms", 0.0) / 1000
    s.stop_reason = timings.get("stop_reason", "")
    s.accepted = details.get("accepted_prediction_tokens", timings.get("draft_n_accepted", 0)) or 0
    s.drafted = timings.get("draft_n", s.accepted + (details.get("rejected_prediction_tokens") or 0))
    s.steps = timings.get("steps", 0)
    s.accept_hist = list(timings.get("accept_hist", []))
    s.offered = timings.get("draft_offered", 0)
    s.skipped = timings.get("draft_skipped_steps", 0)
    s.draft_time = timings.get("draft_ms", 0.0) / 1000
    s.verify_time = timings.get("verify_ms", 0.0) / 1000
    return s


def timings(stats):
    """llama.cpp-style ``timings`` for a server response, plus what :func:`from_usage`
    needs to rebuild the profile."""
    return {
        "prompt_n": stats.prompt_tokens - stats.prompt_reused,
        "cache_n": stats.prompt_reused,
        "prompt_ms": stats.prompt_time * 1000,
        "prompt_per_second": stats.prompt_speed,
        "predicted_n": stats.decode_tokens,
        "predicted_ms": stats.decode_time * 1000,
        "predicted_per_second": stats.decode_speed,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
        "ttft_ms": stats.ttft * 1000,
        "total_ms": stats.total_time * 1000,
        "stop_reason": stats.stop_reason,
        "steps": stats.steps,
        "accept_hist": list(stats.accept_hist),
        "draft_offered": stats.offered,
        "draft_skipped_steps": stats.skipped,
        "draft_ms": stats.draft_time * 1000,
        "verify_ms": stats.verify_time * 1000,
    }
