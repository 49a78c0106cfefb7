"""Copies of the demo model (SmolLM2-135M) with a tools- and thinking-capable chat
template written into each, one per tool-call family geniex parses, so tests exercise
detection and parsing through the real server without a hub. Only the template
differs: every variant keeps SmolLM2's ChatML turns (``<|im_start|>``/``<|im_end|>``,
the tokens the model was trained on) and adds its family's conventions, with the
markers llama.cpp's server detects the family by:

- ``qwen3``: Qwen3's template, reduced: tools in the system turn, calls as
  ``<tool_call>{json}</tool_call>``, tool results as ``<tool_response>``, earlier
  thoughts from ``reasoning_content``, and ``enable_thinking`` false writing an empty
  ``<think></think>`` block after the generation prompt (Hermes family; the shared
  tool-calling model of the tests);
- ``llama3``: Llama 3.x conventions: tools as JSON in the system turn, calls as
  ``{"name", "parameters"}``, tool results in an ``ipython`` turn;
- ``mistral``: ``[AVAILABLE_TOOLS]`` and ``[TOOL_CALLS][...]``;
- ``gemma4``: ``<|tool_call>call:NAME{...}<tool_call|>`` and ``<|tool_response>``;
- ``generic``: renders the tools with none of the families' markers;
- ``think``: a template whose generation prompt opens ``<think>`` itself (DeepSeek-R1
  style; the answer starts inside the block).

    python tests/support/tool_templates.py FAMILY OUT.gguf
"""
import sys
from pathlib import Path

from gguf_edit import edit

_SYSTEM_AND_TOOLS = """
{%- if messages[0].role == 'system' %}{% set system = messages[0].content %}{% set rest = messages[1:] %}
{%- else %}{% set system = 'You are a helpful assistant.' %}{% set rest = messages %}{% endif %}
"""

_TURNS = """{% for m in rest %}
{%- if m.role == 'user' %}<|im_start|>user
{{ m.content }}<|im_end|>
{% elif m.role == 'assistant' %}<|im_start|>assistant
{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>
{% endif %}{{ m.content or '' }}{% if m.tool_calls %}{% for tc in m.tool_calls %}{{ CALL }}{% endfor %}{% endif %}<|im_end|>
{% elif m.role == 'tool' %}{{ RESULT }}
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{{ AFTER_PROMPT }}{% endif %}"""


def _template(system_tools, call, result, after_prompt=""):
    return (_SYSTEM_AND_TOOLS + "<|im_start|>system\n{{ system }}" + system_tools + "<|im_end|>\n"
            + _TURNS.replace("{{ CALL }}", call).replace("{{ RESULT }}", result)
            .replace("{{ AFTER_PROMPT }}", after_prompt))


TEMPLATES = {
    "qwen3": _template(
        "{% if tools %}\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n"
        "<tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n\nFor each function call, return "
        "a json object with function name and arguments within <tool_call></tool_call> XML tags.{% endif %}",
        "<tool_call>\n{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments if "
        "tc.function.arguments is string else tc.function.arguments | tojson }}}\n</tool_call>",
        "<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>",
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"),
    "llama3": _template(
        "{% if tools %}\n\nYou have these functions; to call one, answer with JSON "
        "{\"name\": function name, \"parameters\": arguments}:\n{% for t in tools %}{{ t | tojson }}\n"
        "{% endfor %}{% endif %}",
        "{\"name\": \"{{ tc.function.name }}\", \"parameters\": {{ tc.function.arguments | tojson }}}",
        "<|im_start|>ipython\n{{ m.content }}<|im_end|>{# <|start_header_id|>ipython<|end_header_id|> #}"),
    "mistral": _template(
        "{% if tools %}\n[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}",
        "[TOOL_CALLS][{\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments | tojson }}}]",
        "<|im_start|>user\n[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]<|im_end|>"),
    "gemma4": _template(
        "{% if tools %}\n<|tool>{% for t in tools %}declaration:{{ t.function.name }}{{ t.function | tojson }}"
        "{% endfor %}<tool|>{% endif %}",
        "<|tool_call>call:{{ tc.function.name }}{{ tc.function.arguments }}<tool_call|>",
        "<|im_start|>user\n<|tool_response>response:{{ m.content }}<tool_response|><|im_end|>"),
    "generic": _template(
        "{% if tools %}\n\nTools you may use:\n{% for t in tools %}- {{ t.function.name }}: "
        "{{ t.function | tojson }}\n{% endfor %}{% endif %}",
        "{\"tool_call\": {\"name\": \"{{ tc.function.name }}\", \"arguments\": {{ tc.function.arguments }}}}",
        "<|im_start|>user\nTool result: {{ m.content }}<|im_end|>"),
    "think": _template("", "", "", "<think>\n"),
}


def demo_with_template(src, dst, family):
    """Write the demo GGUF ``src`` with ``family``'s template to ``dst`` (reused if
    newer than ``src`` and this module); returns ``dst``."""
    src, dst = Path(src), Path(dst)
    newest = max(src.stat().st_mtime, Path(__file__).stat().st_mtime)
    if dst.exists() and dst.stat().st_mtime >= newest:
        return dst
    return edit(src, dst, {"tokenizer.chat_template": TEMPLATES[family]})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from geniex.store import demo_model_path
    print(demo_with_template(demo_model_path(), sys.argv[2], sys.argv[1]))
