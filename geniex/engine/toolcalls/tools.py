"""A chat request's ``tools``, ``tool_choice`` and reasoning settings, checked once for
the server and the Python API, and the tools described in a system message for a
template that does not render them (as llama.cpp's server polyfills them)."""
import json

from geniex.engine.toolcalls.reasoning import FORMATS
from geniex.errors import UsageError

CHOICES = ("auto", "none", "required")


def check_tools(tools):
    """``tools`` as OpenAI sends them (``[{"type": "function", "function": {"name", ...}}]``);
    a UsageError naming the first bad one."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise UsageError("tools: expected a list of tool definitions", param="tools")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise UsageError(f"{where}: only {{\"type\": \"function\", \"function\": {{...}}}} tools are supported",
                             param=where)
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise UsageError(f"{where}.function.name: every tool needs a function name", param=f"{where}.function")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise UsageError(f"{where}.function.parameters: expected a JSON schema object",
                             param=f"{where}.function.parameters")
        names.add(fn["name"])
    return tools or None


def check_tool_choice(choice, tools):
    """``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "function":
    {"name": ...}}`` naming one of ``tools`` (the last two need tools: they constrain
    the answer to calls); a UsageError naming ``tool_choice`` otherwise."""
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise UsageError(f"tool_choice: {choice!r} is not one of {', '.join(CHOICES)} or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")
        if choice == "required" and not tools:
            raise UsageError("tool_choice: \"required\" needs tools", param="tool_choice")
        return choice
    if isinstance(choice, dict):
        fn = choice.get("function") if choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            raise UsageError("tool_choice: expected {\"type\": \"function\", \"function\": {\"name\": ...}}",
                             param="tool_choice")
        if not any(t["function"]["name"] == name for t in tools or ()):
            raise UsageError(f"tool_choice: no tool is named {name!r}", param="tool_choice")
        return {"type": "function", "function": {"name": name}}
    raise UsageError("tool_choice: expected \"auto\", \"none\", \"required\" or a named function",
                     param="tool_choice")


def check_reasoning_format(value):
    """One of :data:`~geniex.engine.toolcalls.reasoning.FORMATS`, else a UsageError."""
    if value not in FORMATS:
        raise UsageError(f"reasoning_format: {value!r} is not one of {', '.join(FORMATS)}",
                         param="reasoning_format")
    return value


def template_kwargs(kwargs, enable_think):
    """``chat_template_kwargs`` with GenieX's ``enable_think`` folded in as the
    templates' ``enable_thinking``; a UsageError when the two disagree."""
    if kwargs is not None and not isinstance(kwargs, dict):
        raise UsageError("chat_template_kwargs: expected an object", param="chat_template_kwargs")
    out = dict(kwargs or {})
    if enable_think is None:
        return out or None
    if not isinstance(enable_think, bool):
        raise UsageError(f"enable_think: expected a boolean, got {enable_think!r}", param="enable_think")
    if "enable_thinking" in out and out["enable_thinking"] != enable_think:
        raise UsageError("enable_think: disagrees with chat_template_kwargs.enable_thinking; send one of them",
                         param="enable_think")
    out["enable_thinking"] = enable_think
    return out


def with_tools_described(messages, tools):
    """``messages`` with the tools and the generic call format described at the start
    of the system message (one is added if there is none): for a template that does not
    render ``tools`` itself."""
    text = ("You can call any of the following tools to satisfy the user's requests:\n"
            + json.dumps(tools, ensure_ascii=False, indent=2)
            + "\n\nTo call a tool, answer with JSON only, in this form:\n"
            + '{"tool_call": {"name": "<tool name>", "arguments": {<arguments>}}}\n'
            + "Otherwise answer normally.")
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        first = dict(messages[0], content=text + "\n\n" + messages[0]["content"])
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
