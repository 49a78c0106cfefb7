"""The loop's stop reasons, and the one table of what each API calls them.

An answer ends for one of these reasons (``Stats.stop_reason``): ``eos`` (the model's
end token), ``stop_sequence`` (a stop string), ``user`` (cancelled on purpose: a client
gone, a server stopping), ``length`` (the answer's token limit), ``context_length`` (the
context is full), ``time_limit`` (the server's request timeout). OpenAI's APIs, the
Python API, Anthropic's Messages API and llama.cpp's native API each name them their
own way; every place that reports a stop reads it here.
"""
from typing import NamedTuple


class StopNames(NamedTuple):
    """One stop reason as each API names it."""

    openai: str          # chat/completions finish_reason, the Python API's finish_reason
    anthropic: str       # Messages stop_reason
    llama: str           # llama.cpp's stop_type


STOPS = {
    "eos": StopNames("stop", "end_turn", "eos"),
    "stop_sequence": StopNames("stop", "stop_sequence", "word"),
    # A cancelled answer ended on purpose, not for lack of room.
    "user": StopNames("stop", "end_turn", "none"),
    "length": StopNames("length", "max_tokens", "limit"),
    "context_length": StopNames("length", "max_tokens", "limit"),
    "time_limit": StopNames("length", "max_tokens", "limit"),
}
_UNKNOWN = StopNames("stop", "end_turn", "none")


def names(reason):
    """The API names of the loop's stop ``reason``."""
    return STOPS.get(reason, _UNKNOWN)


def finish_reason(reason, calls=False):
    """OpenAI's ``finish_reason``: ``stop`` | ``length``, and ``tool_calls`` when the
    answer called tools and was not cut short (as llama.cpp's server decides it)."""
    name = names(reason).openai
    return "tool_calls" if calls and name == "stop" else name


def stop_reason(reason, calls=False):
    """Anthropic's ``stop_reason``: ``tool_use`` when the answer called tools and ended
    its turn."""
    name = names(reason).anthropic
    return "tool_use" if calls and name == "end_turn" else name


def cut_short(reason):
    """Whether the answer was cut short by a limit (``length`` in OpenAI's terms)."""
    return names(reason).openai == "length"
