"""Reasoning ("thinking") text at the start of an answer, split from the answer proper.

Reasoning models write their thoughts first, between markers: ``<think>...</think>``
(DeepSeek-R1, Qwen3, SmolLM3 and most others) or Gemma 4's ``<|channel>thought...
<channel|>``. Templates that open the block themselves (the prompt ends with
``<think>``) leave the answer starting inside it ("forced open").

``reasoning_format`` as llama.cpp's server takes it: ``none`` leaves the text as it is
in ``content``; ``deepseek`` (and ``auto``, the same here) moves the thoughts to
``reasoning_content``; ``deepseek-legacy`` also keeps them, tags and all, in
``content`` (and, streamed, sends them in ``content`` only).
"""
from geniex.engine.toolcalls.base import partial_suffix

FORMATS = ("none", "deepseek", "deepseek-legacy", "auto")
MARKERS = (("<think>", "</think>"), ("<|channel>thought", "<channel|>"))


def markers_for(template_source):
    """The (open, close) reasoning markers a template uses (``<think>`` unless it is
    Gemma 4's)."""
    if template_source and "<|channel>" in template_source:
        return MARKERS[1]
    return MARKERS[0]


def forced_open(prompt, markers):
    """True when the prompt itself opened the reasoning block (it ends with the
    opening marker): the answer starts inside it."""
    return prompt.rstrip().endswith(markers[0])


class ReasoningSplitter:
    """Splits streamed answer text into (reasoning, content) pieces. ``feed`` returns
    the pieces it can release; ``finish`` the rest (an unclosed block is reasoning, as
    llama.cpp reads it)."""

    def __init__(self, markers, forced=False):
        self.open, self.close = markers
        self.state = "inside" if forced else "start"
        self.buf = ""

    def feed(self, text):
        self.buf += text
        reasoning = content = ""
        while True:
            if self.state == "start":
                stripped = self.buf.lstrip()
                if stripped.startswith(self.open):
                    self.buf = stripped[len(self.open):]
                    self.state = "inside"
                    continue
                if not stripped or self.open.startswith(stripped):
                    break               # might still become the opening marker
                self.state = "after"
                continue
            if self.state == "inside":
                end = self.buf.find(self.close)
                if end >= 0:
                    reasoning += self.buf[:end]
                    self.buf = self.buf[end + len(self.close):].lstrip()
                    self.state = "after_close"
                    continue
                keep = partial_suffix(self.buf, self.close)
                reasoning += self.buf[:len(self.buf) - keep]
                self.buf = self.buf[len(self.buf) - keep:]
                break
            if self.state == "after_close":
                # Whitespace between the block and the answer belongs to neither.
                self.buf = self.buf.lstrip()
                if not self.buf:
                    break
                self.state = "after"
            content += self.buf
            self.buf = ""
            break
        return reasoning, content

    def finish(self):
        rest, self.buf = self.buf, ""
        if self.state == "inside":
            return rest, ""
        if self.state == "after_close":
            return "", rest.lstrip()
        return "", rest
