"""An answer's text, as it streams, split into content, reasoning and tool calls.

The same parser serves whole answers and streams: :meth:`ChatParser.feed` takes each
piece of text the loop releases and returns what can be released of it (content, any
reasoning, calls that are complete); :meth:`ChatParser.finish` returns the rest. Text
that might be the start of a call's opening is held back until the next piece says
whether it is; everything else goes out at once. A call is released only when it has
been read whole, so a stream never sends a call it would have to take back: text that
opens like a call but is not one goes out as content, and nothing after it is parsed.
"""
from dataclasses import dataclass, field

from geniex.engine.toolcalls.base import ParseError
from geniex.engine.toolcalls.reasoning import ReasoningSplitter


@dataclass
class Delta:
    """What one piece of answer text released: content, reasoning, complete calls."""

    content: str = ""
    reasoning: str = ""
    calls: list = field(default_factory=list)

    def __bool__(self):
        return bool(self.content or self.reasoning or self.calls)


class ChatParser:
    """``family``: the template's tool-call family (None: calls are not parsed);
    ``reasoning_format`` one of :data:`~geniex.engine.toolcalls.reasoning.FORMATS`;
    ``markers`` and ``forced`` the reasoning block's markers and whether the prompt
    opened it; ``streaming`` (deepseek-legacy sends thoughts in content only when
    streamed); ``parallel`` False keeps the first call only (``parallel_tool_calls``)."""

    def __init__(self, family=None, reasoning_format="none", markers=("<think>", "</think>"), forced=False,
                 streaming=False, parallel=True):
        self.family = family
        self.splitter = ReasoningSplitter(markers, forced) if reasoning_format != "none" else None
        self.legacy = reasoning_format == "deepseek-legacy"
        self.markers = markers
        self.streaming = streaming
        self.parallel = parallel
        self.calls = []                 # every call released so far
        self._buf = ""
        self._in_call = False
        self._at_start = True           # only whitespace released as content so far
        self._after_call = False

    def feed(self, text):
        """Release what ``text`` (the next piece of the answer) makes certain."""
        return self._step(text, final=False)

    def finish(self):
        """Release everything still held at the end of the answer."""
        return self._step("", final=True)

    def _step(self, text, final):
        out = Delta()
        if self.splitter is None:
            content = text
        elif self.legacy:
            reasoning, _ = self.splitter.finish() if final else self.splitter.feed(text)
            content = text
            if not self.streaming:
                out.reasoning = reasoning
        else:
            reasoning, content = self.splitter.finish() if final else self.splitter.feed(text)
            out.reasoning = reasoning
        self._content(content, final, out)
        return out

    def _content(self, text, final, out):
        if self.family is None:
            self._emit(text, out)
            return
        self._buf += text
        while True:
            if not self._in_call:
                if self._after_call:
                    stripped = self._buf.lstrip()
                    if not stripped:
                        if final:
                            self._buf = ""
                        return          # whitespace between calls belongs to nothing yet
                    self._buf = stripped
                    self._after_call = False
                i = self.family.find_opening(self._buf, self._at_start)
                if i is None:
                    keep = len(self._buf) if final else self.family.hold(self._buf, self._at_start)
                    self._emit(self._buf[:keep], out)
                    self._buf = self._buf[keep:]
                    return
                self._emit(self._buf[:i], out)
                self._buf = self._buf[i:]
                self._in_call = True
            try:
                got = self.family.scan(self._buf, final)
            except ParseError:
                # Not a call after all: the rest of the answer is content, unparsed.
                self.family = None
                self._in_call = False
                self._emit(self._buf, out)
                self._buf = ""
                return
            if got is None:
                return
            found, used = got
            self._buf = self._buf[used:]
            self._in_call = False
            if isinstance(found, str):
                self._emit(found, out)      # the generic format's {"response": ...}
            else:
                for call in found:
                    if self.parallel or not self.calls:
                        self.calls.append(call)
                        out.calls.append(call)
                self._after_call = True
            if final and not self._buf:
                return

    def _emit(self, text, out):
        if text:
            out.content += text
            if text.strip():
                self._at_start = False


def parse(text, family=None, reasoning_format="none", markers=("<think>", "</think>"), forced=False,
          parallel=True):
    """A whole answer's ``(content, reasoning, calls)``: the text in one piece through
    :class:`ChatParser` (what a non-streamed answer gets)."""
    parser = ChatParser(family, reasoning_format, markers, forced, streaming=False, parallel=parallel)
    first, last = parser.feed(text), parser.finish()
    return first.content + last.content, first.reasoning + last.reasoning, first.calls + last.calls
