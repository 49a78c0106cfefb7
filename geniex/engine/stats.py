"""Per-answer statistics: read by the profile line, the server's usage, and the trace."""
import dataclasses
import time
from dataclasses import dataclass, field


@dataclass
class Stats:
    """Counters and timings of one answer. Times are seconds."""

    prompt_tokens: int = 0        # tokens of the full prompt
    prompt_reused: int = 0        # of which already in the KV cache (conversation reuse)
    prompt_time: float = 0.0
    ttft: float = 0.0             # request start -> first committed token
    decode_tokens: int = 0        # committed answer tokens (not counting an end token)
    decode_time: float = 0.0      # first verify step -> end
    total_time: float = 0.0
    stop_reason: str = ""         # eos | length | user | stop_sequence | context_length
    steps: int = 0                # target verify decodes
    drafted: int = 0              # draft tokens checked against the target
    accepted: int = 0             # of which the target agreed with
    accept_hist: list = field(default_factory=list)   # accept_hist[n] = steps that accepted n
    offered: int = 0              # draft tokens the drafters proposed (the policy verifies fewer)
    skipped: int = 0              # steps with a proposal of which the policy verified none
    draft_time: float = 0.0
    verify_time: float = 0.0
    spec_types: tuple = ()        # drafting methods in use ('' when plain)
    # per drafting method: [verify steps with its draft, drafted, accepted, accept_hist]
    by_method: dict = field(default_factory=dict)

    @property
    def prompt_speed(self):
        n = self.prompt_tokens - self.prompt_reused
        return n / self.prompt_time if self.prompt_time > 0 else 0.0

    @property
    def decode_speed(self):
        return self.decode_tokens / self.decode_time if self.decode_time > 0 else 0.0

    @property
    def accept_rate(self):
        return self.accepted / self.drafted if self.drafted else 0.0

    def record_step(self, drafted, accepted, draft_time=0.0, verify_time=0.0, elapsed=None, offered=0,
                    method=""):
        """Count one verify step that checked ``drafted`` tokens and kept ``accepted``, of
        ``offered`` the drafter proposed; ``elapsed`` (seconds since the request started)
        is given when the step committed answer tokens, and the first one is the time to
        first token. ``method`` names the drafter whose draft was verified (the
        per-method counters of the server's /metrics)."""
        self.steps += 1
        self.offered += offered
        if offered and not drafted:
            self.skipped += 1
        self.draft_time += draft_time
        self.verify_time += verify_time
        if elapsed is not None and not self.ttft:
            self.ttft = elapsed
        self.drafted += drafted
        self.accepted += accepted
        if drafted:
            _count(self.accept_hist, accepted)
            if method:
                mine = self.by_method.setdefault(method, [0, 0, 0, []])
                mine[0] += 1
                mine[1] += drafted
                mine[2] += accepted
                _count(mine[3], accepted)

    def finish(self, generated, stop, t_decode, t_start):
        """Close the answer: its token count, stop reason and times (perf_counter starts)."""
        now = time.perf_counter()
        self.decode_tokens = generated
        self.decode_time = now - t_decode
        self.total_time = now - t_start
        self.stop_reason = stop

    def to_dict(self):
        """Plain JSON-able view of every field and the two speeds (the trace's summary)."""
        out = dataclasses.asdict(self)
        out.update(spec_types=list(self.spec_types), prompt_speed=self.prompt_speed,
                   decode_speed=self.decode_speed)
        return out


def _count(hist, n):
    """``hist[n] += 1``, growing the list as needed."""
    while len(hist) <= n:
        hist.append(0)
    hist[n] += 1
