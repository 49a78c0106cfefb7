"""Which tool-call family a chat template speaks, from markers in its source, checked
in the order llama.cpp's server checks them (``common_chat_templates_apply_jinja``):
Gemma 4's ``<|tool_call>``, Hermes/Qwen's ``<tool_call>``, Llama 3.x's ``ipython``
header, Mistral's ``[TOOL_CALLS]``; anything else is the generic JSON format."""
from geniex.engine.toolcalls.gemma4 import Gemma4
from geniex.engine.toolcalls.generic import Generic
from geniex.engine.toolcalls.hermes import Hermes
from geniex.engine.toolcalls.llama3 import Llama3
from geniex.engine.toolcalls.mistral import Mistral

FAMILIES = {f.name: f for f in (Gemma4, Hermes, Llama3, Mistral, Generic)}

_MARKERS = (
    ("<|tool_call>", Gemma4),
    ("<tool_call>", Hermes),
    ("<|start_header_id|>ipython<|end_header_id|>", Llama3),
    ("[TOOL_CALLS]", Mistral),
)


def family_of(source):
    """The :class:`~geniex.engine.toolcalls.base.Family` (an instance) of a template's
    source text (None or empty: generic)."""
    for marker, family in _MARKERS:
        if source and marker in source:
            return family()
    return Generic()
