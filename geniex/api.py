"""A small Python API over the engine, for notebooks and debuggers.

    import geniex.api as gx
    session = gx.load("demo", spec_type="ngram-mod")
    for step in gx.steps(session, "Repeat: the quick brown fox", max_tokens=32):
        print(step.n_past, step.drafted, step.target, step.accepted, step.committed)
    print(gx.generate(session, "Name a colour", json_schema={"type": "object"}))

Each :class:`~geniex.engine.loop.Step` is one target decode of the accept loop; a
breakpoint inside the ``for`` stops between steps with the loop's state in hand.
"""
from geniex import config
from geniex.engine.chat import Conversation
from geniex.engine.constraints import Grammar, GrammarError
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import load_options, open_session
from geniex.speculative import options as spec_options


def load(model="demo", *, nctx=4096, ngl=-1, compute=None, threads=0, prompt_kv="f16", chat_template=None,
         data_dir=None, **spec):
    """Open a Session on a store name or GGUF path, with optional speculative decoding.

    ``spec`` takes the speculative settings by their flag names (``spec_type``,
    ``draft_model``, ``draft_tokens``, ``draft_min``, ``draft_p_min``, ``ngram_n``,
    ``ngram_min``, ``ngram_max``: see :data:`geniex.speculative.options.FIELDS`).
    ``prompt_kv`` is ``--prompt-kv`` (``"f16"``: prompts are read in an F16 cache of
    their own; ``"none"``: on the answer's cache). ``chat_template`` is ``--chat-template``
    (a built-in format's name, a Jinja file's path, or Jinja text). Names resolve through the same store
    as the CLI (nothing is downloaded here: pull with ``geniex pull`` first). The context size is checked as ``geniex infer`` checks
    it (:func:`~geniex.engine.session.open_session`).
    """
    from geniex.store import Store
    store = Store(config.data_dir(data_dir))
    resolved = store.resolve(model)
    draft = spec.get("draft_model")
    draft_path = store.resolve(draft).path if draft else None
    from geniex.engine.chat import template_choice
    options = load_options(dict(nctx=nctx, ngl=ngl, compute=compute, threads=threads, prompt_kv=prompt_kv,
                                chat_template=template_choice(chat_template, "chat_template")),
                           data_dir=data_dir,
                           spec=spec_options.from_kwargs(spec, draft_path))
    return open_session(resolved, options)


def chat(session, system_prompt=None):
    """A :class:`~geniex.engine.chat.Conversation` on ``session``."""
    return Conversation(session, system_prompt)


def constraint(grammar=None, json_schema=None, kind="gbnf"):
    """A :class:`~geniex.engine.constraints.Grammar` from ``grammar`` (text of ``kind``:
    gbnf, lark or regex; or a Grammar already made) or ``json_schema`` (a dict or JSON
    text; ``{}`` = any JSON object), or None. GrammarError on a bad grammar."""
    if grammar is not None and json_schema is not None:
        raise GrammarError("give grammar or json_schema, not both")
    if isinstance(grammar, Grammar):
        return grammar
    if grammar is not None:
        return Grammar.parse(kind, grammar, param="grammar")
    if json_schema is not None:
        return Grammar.parse("json_schema" if json_schema not in ({}, "{}") else "json_object", json_schema,
                             param="json_schema")
    return None


def steps(session, prompt, *, max_tokens=256, stop=(), temperature=0.0, seed=0, grammar=None, json_schema=None,
          grammar_kind="gbnf", **sampling):
    """Answer one chat turn, yielding each loop Step; the last has ``.stop`` set.
    ``grammar`` / ``json_schema`` constrain the answer (see :func:`constraint`)."""
    conv = Conversation(session)
    opts = GenOptions(max_tokens=max_tokens, stop=tuple(stop),
                      sampling=SamplingParams(temperature=temperature, seed=seed, **sampling),
                      grammar=constraint(grammar, json_schema, grammar_kind))
    gen = conv.ask(prompt, opts)
    yield from gen


def generate(session, prompt, **options):
    """Answer one chat turn and return its text (the options of :func:`steps`)."""
    return "".join(step.text for step in steps(session, prompt, **options))


def answer(session, messages, *, tools=None, tool_choice="auto", parallel_tool_calls=True, reasoning_format="auto",
           template_kwargs=None, max_tokens=256, stop=(), temperature=0.0, seed=0, reasoning_budget=-1,
           **sampling):
    """Answer a conversation (OpenAI-style ``messages``) as the server's chat route does,
    through the same engine task: returns ``{"content", "reasoning_content",
    "tool_calls", "finish_reason"}`` with the model's tool calls parsed in its
    template's format (docs/tools-and-reasoning.md). ``tool_choice`` "required" or a
    named function constrains the answer to calls; ``reasoning_budget`` N closes the
    reasoning block after N thought tokens (-1: no limit). UsageError on a bad value."""
    from geniex.engine import stops, tasks
    from geniex.engine.toolcalls import tools as agent
    tools = agent.check_tools(tools)
    task = tasks.ChatTask(list(messages), GenOptions(max_tokens=max_tokens, stop=tuple(stop),
                                                     sampling=SamplingParams(temperature=temperature, seed=seed,
                                                                             **sampling)),
                          tools=tools, tool_choice=agent.check_tool_choice(tool_choice, tools),
                          parallel_tool_calls=parallel_tool_calls,
                          reasoning_format=agent.check_reasoning_format(reasoning_format),
                          template_kwargs=agent.template_kwargs(template_kwargs, None),
                          reasoning_budget=reasoning_budget)
    content, reasoning, calls, stats = [], [], [], None
    for event in tasks.run(session, task):
        if isinstance(event, tasks.Piece):
            content.append(event.text)
            reasoning.append(event.reasoning)
            calls.extend(event.calls)
        elif isinstance(event, tasks.Done):
            stats = event.stats
    text = "".join(content)
    return {"content": None if calls and not text.strip() else text, "reasoning_content": "".join(reasoning) or None,
            "tool_calls": calls, "finish_reason": stops.finish_reason(stats.stop_reason, bool(calls))}
