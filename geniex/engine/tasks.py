"""The engine side of a server request, as plain data: a task in, events out.

The server turns a validated request body into a task (which messages or prompt, how
to answer) and runs it on the resident model with :func:`run`; everything that
touches the model (the chat template, tokenizing, the accept loop) happens inside the
run. Tasks and events are plain picklable dataclasses, so a run can as well happen in
another process that owns the model, with only tasks going in and events coming out.

A run yields :class:`Piece` events as the answer is committed (the text a step
released and its tokens), then one :class:`Done` with the answer's statistics.
Errors are raised as :class:`~geniex.errors.GenieXError` subclasses before the first
event where they concern the request (a prompt that does not fit, a template that
refuses the conversation), so a caller can still answer with an error status.
"""
from dataclasses import dataclass, field

from geniex.engine.chat import template_for
from geniex.engine.loop import GenOptions
from geniex.engine.stats import Stats
from geniex.errors import UsageError


@dataclass
class ChatTask:
    """Answer a conversation through the model's chat template."""

    messages: list                       # [{"role", "content", ...}] as the template takes them
    options: GenOptions = field(default_factory=GenOptions)
    tools: list | None = None            # OpenAI tool definitions, for templates that render them
    template_kwargs: dict | None = None  # more template variables (chat_template_kwargs)
    keep_cache: bool = False             # reuse the KV cache of the previous answer's prefix


@dataclass
class CompletionTask:
    """Continue a raw prompt (no template); never drafts."""

    prompt: str | list                   # text, or token ids
    options: GenOptions = field(default_factory=GenOptions)
    keep_cache: bool = False


@dataclass
class ForgetDrafts:
    """Make the drafters forget what they learned from earlier answers (and the KV cache)."""


@dataclass
class Piece:
    """Text released by one step of the loop, and the answer tokens it committed."""

    text: str
    tokens: list


@dataclass
class Done:
    """The end of a run: the answer's statistics (empty for a task that answers nothing)."""

    stats: Stats = field(default_factory=Stats)


def run(session, task, cancel=None):
    """Run ``task`` on ``session`` (a :class:`~geniex.engine.session.Session`), yielding
    events; ``cancel()`` turning true ends an answer at its next step."""
    if isinstance(task, ChatTask):
        yield from _chat(session, task, cancel)
    elif isinstance(task, CompletionTask):
        yield from _complete(session, task, cancel)
    elif isinstance(task, ForgetDrafts):
        session.reset(drafts=True)
        yield Done()
    else:
        raise TypeError(f"not a task: {task!r}")


def _chat(session, task, cancel):
    if not task.keep_cache:
        session.reset()
    prompt = template_for(session.model).render(task.messages, tools=task.tools, extra=task.template_kwargs)
    tokens = session.tokenize_prompt(prompt)
    yield from _answer(session.generate(tokens, task.options, cancel=cancel))


def _complete(session, task, cancel):
    if not task.keep_cache:
        session.reset()
    if isinstance(task.prompt, str):
        tokens = session.vocab.tokenize(task.prompt, add_special=session.vocab.add_bos)
    else:
        tokens = list(task.prompt)
    if not tokens:
        raise UsageError("prompt: the prompt is empty")
    yield from _answer(session.generate(tokens, task.options, cancel=cancel, speculative=False))


def _answer(generation):
    for step in generation:
        if step.text or step.committed:
            yield Piece(step.text, step.committed)
    yield Done(generation.stats)
