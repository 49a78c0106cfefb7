"""Tool calls and reasoning in a chat answer, per chat-template family.

The model writes calls in the format its template taught it; :func:`family_of` tells
which from the template's source (as llama.cpp's server does), and :class:`ChatParser`
reads the answer, streamed or whole, into content, reasoning and OpenAI-shaped calls.
One module per family: :mod:`.hermes` (Hermes, Qwen 2.5/3), :mod:`.llama3`,
:mod:`.mistral`, :mod:`.gemma4`, :mod:`.generic` (anything else); :mod:`.reasoning`
splits ``<think>`` blocks; :mod:`.tools` checks a request's tools and describes them
to templates that do not render them.
"""
from geniex.engine.toolcalls.base import ParseError, ToolCall
from geniex.engine.toolcalls.detect import FAMILIES, family_of
from geniex.engine.toolcalls.parser import ChatParser, Delta, parse
from geniex.engine.toolcalls.reasoning import FORMATS as REASONING_FORMATS
from geniex.engine.toolcalls.reasoning import forced_open, markers_for

__all__ = ["ChatParser", "Delta", "FAMILIES", "ParseError", "REASONING_FORMATS", "ToolCall", "family_of",
           "forced_open", "markers_for", "parse"]
