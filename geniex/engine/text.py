"""Incremental detokenization: never split a UTF-8 character, never print a stop string."""
import codecs


class TextStream:
    """Turns token bytes into printable text as they arrive.

    Bytes of a multi-byte character that spans tokens are held until complete. Text
    that could be the start of a stop string is held until it is known not to be;
    when a stop string appears, the text before it is released and the rest dropped.
    """

    def __init__(self, stops=()):
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, data):
        """Add one token's bytes; returns the text that can be shown now."""
        s = self._held + self._decoder.decode(data)
        if not self.stops:
            self._held = ""
            return s
        cut = min((i for i in (s.find(stop) for stop in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return s[:cut]
        hold = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(s)), 0, -1):
                if s.endswith(stop[:n]):
                    hold = max(hold, n)
                    break
        self._held = s[len(s) - hold:] if hold else ""
        return s[:len(s) - hold]

    def flush(self):
        """End of the answer: release whatever is held (an incomplete character as U+FFFD)."""
        if self.stopped:
            return ""
        s = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return s
