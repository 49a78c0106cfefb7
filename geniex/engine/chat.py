"""Chat prompts: the model's own template, and a conversation that reuses its KV cache.

The prompt is the model's ``tokenizer.chat_template`` rendered with Jinja2 as Hugging
Face transformers renders it (:mod:`geniex.engine.template`), with ``bos_token`` and
``eos_token`` from the vocabulary, so that a chat request gives the same prompt tokens
as llama.cpp's server. llama.cpp's built-in formats (``llama_chat_apply_template``,
which guesses the family from the template text) are used only for a model without a
template (chatml, as llama.cpp's server does) or a template Jinja cannot render.
Which one a model gets is logged once per loaded model (``--verbose`` shows it).
"""
import dataclasses
import logging
import weakref
from pathlib import Path

from geniex.engine import think_budget
from geniex.engine.template import MAX_SOURCE, JinjaTemplate, TemplateFailed
from geniex.errors import GenieXError, UsageError
from geniex.llama.chat_template import apply_builtin, builtin_names

log = logging.getLogger("geniex.engine")

_PROBE = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]

# A model without a chat template gets llama.cpp's built-in format of its architecture's
# family where the family has one format (llama.cpp's server uses chatml for all of
# them). Architectures whose models use several formats (llama: Llama 2 and 3, Mistral)
# are not guessed.
ARCH_TEMPLATES = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
    "phi3": "phi3", "command-r": "command-r", "cohere2": "command-r", "exaone": "exaone3",
    "exaone4": "exaone4", "granite": "granite", "chatglm": "chatglm4", "deepseek2": "deepseek2",
    "minicpm": "minicpm", "orion": "orion", "gpt-oss": "gpt-oss", "rwkv6": "rwkv-world",
    "rwkv7": "rwkv-world", "hunyuan-moe": "hunyuan-moe", "hunyuan-dense": "hunyuan-dense",
}


def template_choice(value, flag="--chat-template"):
    """What ``--chat-template VALUE`` asks for, checked now: one of llama.cpp's built-in
    format names (kept as the name), or Jinja source, given as a file's path or as the
    text itself (returned as the text, so a worker process needs no file). None for
    none. UsageError naming ``flag`` for anything else."""
    if value is None or value == "":
        return None
    value = str(value)
    names = builtin_names()
    if value in names:
        return value
    text = value
    if "{{" not in value and "{%" not in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise UsageError(f"{flag} {value}: neither one of llama.cpp's built-in templates "
                             f"({', '.join(names)}) nor a Jinja template file")
        if path.stat().st_size > MAX_SOURCE:
            raise UsageError(f"{flag} {value}: a template file of over {MAX_SOURCE:,} bytes")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{flag} {value}: cannot read it as UTF-8 text ({e})") from None
    try:
        JinjaTemplate(text)
    except TemplateFailed as e:
        raise UsageError(f"{flag} {value}: not a Jinja template geniex can render ({e})") from None
    return text


class ChatTemplate:
    """Renders a list of chat messages (``{"role", "content", ...}``) into one prompt string.

    ``kind`` is ``"jinja"`` (the model's own template) or ``"builtin"`` (llama.cpp's
    format); ``note`` says which and why, in one line.
    """

    def __init__(self, model, choice=None):
        """``choice``: a :func:`template_choice` (``--chat-template``) in place of the
        model's own template."""
        vocab = model.vocab
        self.source = choice or model.chat_template()
        self.bos_token = _token_text(vocab, vocab.bos)
        self.eos_token = _token_text(vocab, vocab.eos)
        self.add_bos, self.add_eos = vocab.add_bos, vocab.add_eos
        self._jinja = None
        self.kind = "builtin"
        if choice and choice in builtin_names():
            self.note = f"chat template: llama.cpp's built-in {choice} format (--chat-template)"
            log.info("%s", self.note)
            return
        if not self.source:
            family = ARCH_TEMPLATES.get(model.architecture)
            if family is not None:
                self.source = family
                self.note = (f"chat template: the model has none; using llama.cpp's built-in {family} format, "
                             f"its architecture's ({model.architecture}; --chat-template chooses another)")
                log.warning("%s", self.note)
                return
            self.note = ("chat template: the model has none; using llama.cpp's built-in chatml "
                         "format (as llama.cpp's server does; --chat-template chooses another)")
            log.info("%s", self.note)
            return
        try:
            self._jinja = JinjaTemplate(self.source, self.bos_token, self.eos_token)
            self.kind = "jinja"
            self.note = ("chat template: --chat-template's, rendered with Jinja2" if choice else
                         "chat template: the model's own (tokenizer.chat_template), rendered with Jinja2")
            log.info("%s", self.note)
        except TemplateFailed as e:
            if apply_builtin(self.source, _PROBE) is not None:
                self.note = (f"chat template: the model's template does not compile in Jinja2 ({e}); "
                             "using llama.cpp's built-in format for its family")
            else:
                self.source = None
                self.note = (f"chat template: the model's template does not compile in Jinja2 ({e}) and "
                             "llama.cpp does not recognise its family; using chatml")
            log.warning("%s", self.note)

    @property
    def renders_tools(self):
        """True when the model's own template shows a request's ``tools`` in the prompt."""
        return self._jinja is not None and self._jinja.tools

    def render(self, messages, add_assistant=True, tools=None, extra=None):
        """The prompt text for ``messages``, ending where the assistant's answer starts
        (``add_assistant``). ``tools`` (OpenAI tool definitions) and ``extra`` (more
        template variables) reach the model's own template only. Raises
        :class:`~geniex.engine.template.TemplateRefused` (a GenieXError) when the
        template rejects the conversation."""
        if self._jinja is not None:
            try:
                text = self._jinja.render(messages, add_assistant, tools=tools, extra=extra)
            except TemplateFailed as e:
                text = apply_builtin(self.source, messages, add_assistant)
                if text is None:
                    raise GenieXError(f"the model's chat template failed ({e}) and llama.cpp has no "
                                      "built-in format for it") from None
                log.warning("the model's chat template failed in Jinja2 (%s); this prompt used "
                            "llama.cpp's built-in format for its family", e)
                return text
            # As llama.cpp's server: tokenizing adds BOS (and EOS) where the vocabulary
            # asks for them, so a template that writes them itself loses its copy here.
            if self.add_bos and self.bos_token and text.startswith(self.bos_token):
                text = text[len(self.bos_token):]
            if self.add_eos and self.eos_token and text.endswith(self.eos_token):
                text = text[:-len(self.eos_token)]
            return text
        text = apply_builtin(self.source, messages, add_assistant)
        if text is None:
            raise GenieXError("llama.cpp could not format the conversation with its built-in template")
        return text


_templates = weakref.WeakKeyDictionary()


def template_for(model, choice=None):
    """The :class:`ChatTemplate` of a loaded model (with ``choice``, a
    :func:`template_choice`, in place of its own), made (and logged) once per model."""
    made = _templates.setdefault(model, {})
    template = made.get(choice)
    if template is None:
        template = made[choice] = ChatTemplate(model, choice)
    return template


def _token_text(vocab, token):
    # llama.cpp's server gives templates the token's piece with special tokens rendered.
    return vocab.piece(token).decode("utf-8", "replace") if token >= 0 else ""


class Conversation:
    """A chat on a :class:`~geniex.engine.session.Session`.

    Each turn renders the whole conversation and hands it to the session, which decodes
    only the tokens after the longest prefix already in its KV cache, so a follow-up
    turn costs its new tokens only.
    """

    def __init__(self, session, system_prompt=None, template_kwargs=None, reasoning_budget=-1, budget_message=""):
        self.session = session
        self.template = template_for(session.model, session.options.chat_template)
        self.template_kwargs = template_kwargs      # more template variables (enable_thinking, ...)
        # Thought tokens before the reasoning block is closed (-1: no limit; think_budget).
        self.reasoning_budget, self.budget_message = reasoning_budget, budget_message
        self.messages = []
        if system_prompt:
            self.messages.append({"role": "system", "content": system_prompt})

    def prompt_tokens(self, messages=None):
        """Tokens of the templated conversation (``messages`` or this one's)."""
        return self.session.tokenize_prompt(self.template.render(messages or self.messages,
                                                                 extra=self.template_kwargs))

    def ask(self, user_text, opts, cancel=None):
        """Add a user turn and start the answer; returns a Generation. Call
        :meth:`finish` with it once consumed so the answer joins the conversation."""
        turn = {"role": "user", "content": user_text}
        # Render before recording the turn: a template that refuses the conversation
        # leaves it as it was.
        prompt = self.template.render(self.messages + [turn], extra=self.template_kwargs)
        tokens = self.session.tokenize_prompt(prompt)
        if self.reasoning_budget >= 0:
            budget = think_budget.for_prompt(self.reasoning_budget, self.template.source, prompt,
                                             self.budget_message, opts.grammar)
            opts = dataclasses.replace(opts, think_budget=budget)
        self.messages.append(turn)
        return self.session.generate(tokens, opts, cancel)

    def finish(self, generation):
        """Record the assistant's answer (possibly cut short) in the conversation."""
        self.messages.append({"role": "assistant", "content": generation.text})
