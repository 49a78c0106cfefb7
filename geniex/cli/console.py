"""Terminal interaction shared by ``infer`` and ``run``: prompts from flags, the
interactive loop, and Ctrl-C that ends an answer rather than the program."""
import signal
import sys

from geniex.errors import UsageError

CHAT_HELP = "commands: /clear forgets the conversation, /bye (or Ctrl-D) quits; Ctrl-C ends an answer"


class CtrlC:
    """First Ctrl-C during an answer ends that answer (stop reason ``user``); outside an
    answer, or a second time, it interrupts the program."""

    def __init__(self):
        self.answering = False
        self.pressed = False

    def __enter__(self):
        self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._old)

    def _handle(self, _signum, _frame):
        if self.answering and not self.pressed:
            self.pressed = True
            return
        raise KeyboardInterrupt

    def cancelled(self):
        """The ``cancel`` callable the engine polls between steps."""
        return self.pressed


def read_input(path):
    """The text of ``-i/--input`` (``-`` = stdin)."""
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"--input {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--input {path}: not UTF-8 text") from None


def prompts(args):
    """The one-shot turns: each ``-p``, with ``-i``'s text appended to the first (or the
    file alone). Empty means an interactive session."""
    turns = list(args.prompt)
    if args.input:
        text = read_input(args.input)
        turns = [turns[0] + "\n\n" + text] + turns[1:] if turns else [text]
    return turns


def interactive(answer, clear):
    """Read turns from stdin until ``/bye`` or end of input; ``answer(text)`` handles a
    turn, ``clear()`` forgets the conversation."""
    tty = sys.stdin.isatty()
    if tty:
        print(CHAT_HELP, file=sys.stderr)
    while True:
        if tty:
            print(">>> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.strip()
        if not text:
            continue
        if text in ("/bye", "/exit", "/quit"):
            break
        if text == "/clear":
            clear()
            print("(conversation cleared)", file=sys.stderr)
            continue
        if text in ("/?", "/help"):
            print(CHAT_HELP, file=sys.stderr)
            continue
        answer(text)
