"""Chat prompts: the model's own template, and a conversation that reuses its KV cache.

Templates are applied by llama.cpp (``llama_chat_apply_template``, which recognises the
common families from the template text). A template it does not recognise is rendered
with Jinja2 in a sandbox (Jinja2 comes with Flask). A model without a template gets
the plain text of the messages, and ``--verbose`` says so.
"""
import ctypes
import logging

from geniex.errors import GenieXError
from geniex.llama import api

log = logging.getLogger("geniex.engine")


class ChatTemplate:
    """Renders a list of ``{"role", "content"}`` messages into one prompt string."""

    def __init__(self, model):
        self._lib = model._lib
        self.source = model.chat_template()
        self.kind = "model" if self.source else "plain"
        if self.source and self._apply_native([{"role": "user", "content": "x"}], True) is None:
            self.kind = "jinja"
        if self.kind == "plain":
            log.info("the model has no chat template: prompts are passed as plain text")

    def _apply_native(self, messages, add_assistant):
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        arr = (api.llama_chat_message * max(1, len(keep)))(*[api.llama_chat_message(r, c) for r, c in keep])
        tmpl = self.source.encode()
        size = 4096 + sum(len(c) for _, c in keep) * 2
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_chat_apply_template(tmpl, arr, len(keep), add_assistant, buf, size)
            if n < 0:
                return None
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        return None

    def _apply_jinja(self, messages, add_assistant):
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise GenieXError(f"the model's chat template refused the conversation: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.source).render(
            messages=messages, add_generation_prompt=add_assistant, bos_token="", eos_token="")

    def render(self, messages, add_assistant=True):
        """The prompt text for ``messages``, ending where the assistant's answer starts."""
        if self.kind == "model":
            text = self._apply_native(messages, add_assistant)
            if text is not None:
                return text
        if self.kind in ("model", "jinja"):
            return self._apply_jinja(messages, add_assistant)
        return "\n\n".join(m["content"] for m in messages if m["content"])


class Conversation:
    """A chat on a :class:`~geniex.engine.session.Session`.

    Each turn renders the whole conversation and hands it to the session, which decodes
    only the tokens after the longest prefix already in its KV cache, so a follow-up
    turn costs its new tokens only.
    """

    def __init__(self, session, system_prompt=None):
        self.session = session
        self.template = ChatTemplate(session.model)
        self.messages = []
        if system_prompt:
            self.messages.append({"role": "system", "content": system_prompt})

    def prompt_tokens(self, messages=None):
        """Tokens of the templated conversation (``messages`` or this one's)."""
        return self.session.tokenize_prompt(self.template.render(messages or self.messages))

    def ask(self, user_text, opts, cancel=None):
        """Add a user turn and start the answer; returns a Generation. Call
        :meth:`finish` with it once consumed so the answer joins the conversation."""
        self.messages.append({"role": "user", "content": user_text})
        return self.session.generate(self.prompt_tokens(), opts, cancel)

    def finish(self, generation):
        """Record the assistant's answer (possibly cut short) in the conversation."""
        self.messages.append({"role": "assistant", "content": generation.text})
