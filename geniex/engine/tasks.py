"""The engine side of a server request, as plain data: a task in, events out.

The server turns a validated request body into a task (which messages or prompt, how
to answer) and runs it on the resident model with :func:`run`; everything that
touches the model (the chat template, tokenizing, the accept loop) happens inside the
run. Tasks and events are plain picklable dataclasses, so a run can as well happen in
another process that owns the model, with only tasks going in and events coming out.

A run yields :class:`Piece` events as the answer is committed (the text a step
released and its tokens), then one :class:`Done` with the answer's statistics; with
``progress`` a task first yields :class:`Progress` events as its prompt is decoded.
Tasks that answer at once (tokenize, templates, embeddings, the model's properties)
yield one :class:`Result` with plain data, then :class:`Done`.
Errors are raised as :class:`~geniex.errors.GenieXError` subclasses before the first
event where they concern the request (a prompt that does not fit, a template that
refuses the conversation), so a caller can still answer with an error status.
"""
import dataclasses
import time
from dataclasses import dataclass, field

from geniex.engine import embedding, logprobs, think_budget, toolcalls
from geniex.engine.toolcalls import grammar as _grammar  # noqa: F401 - toolcalls.grammar, used by _chat
from geniex.engine.toolcalls import tools as _tools  # noqa: F401 - toolcalls.tools, used by _render
from geniex.engine.chat import template_for
from geniex.engine.loop import GenOptions
from geniex.engine.stats import Stats
from geniex.errors import ContextLengthExceeded, GenieXError, Unsupported, UsageError
from geniex.llama import api


@dataclass
class Streaming:
    """What a decoding task reports besides its text (llama.cpp's request fields)."""

    speculative: bool = True             # draft with the session's drafters (if any)
    # The request's own speculative setup (a SpecOptions, answered on the drafters as
    # loaded: geniex.speculative.per_answer); None: the setup the model was loaded with.
    spec: object = None
    progress: bool = False               # Progress events while the prompt is decoded
    timings_per_token: bool = False      # running timings on every Piece
    stream: bool = False                 # the answer is streamed (deepseek-legacy reasoning differs)


@dataclass
class ChatTask:
    """Answer a conversation through the model's chat template. With ``continue_final``
    the last (assistant) message is continued rather than answered (llama.cpp's
    assistant prefill)."""

    messages: list                       # [{"role", "content", ...}] as the template takes them
    options: GenOptions = field(default_factory=GenOptions)
    tools: list | None = None            # OpenAI tool definitions, for templates that render them
    template_kwargs: dict | None = None  # more template variables (chat_template_kwargs)
    # Reuse the cached prefix of the prompt (the context's, or a saved conversation's):
    # None = where it cannot change the answer (a quantized KV cache), as llama.cpp's
    # cache_prompt; True/False = always/never.
    keep_cache: bool | None = None
    owner: object = None                 # whose cached conversations it may reuse (an API key's index)
    continue_final: bool = False
    add_generation_prompt: bool = True   # end the prompt where the assistant's answer starts
    streaming: Streaming = field(default_factory=Streaming)
    # "auto": calls parsed out of the answer; "none": tools left out; "required" or
    # {"type": "function", "function": {"name": ...}}: the answer is constrained to calls
    tool_choice: str | dict = "auto"
    parallel_tool_calls: bool = True     # False: the first call only
    reasoning_format: str = "none"       # none | deepseek | deepseek-legacy | auto (toolcalls.reasoning)
    # Thought tokens before the reasoning block is closed for the model (-1: no limit;
    # geniex.engine.think_budget), and the text put before the closing marker then.
    reasoning_budget: int = -1
    reasoning_budget_message: str = ""


@dataclass
class CompletionTask:
    """Continue a raw prompt (no template). ``/v1/completions`` never drafts; llama.cpp's
    ``/completion`` does when the model has drafters (``streaming.speculative``)."""

    prompt: str | list                   # text, or token ids
    options: GenOptions = field(default_factory=GenOptions)
    keep_cache: bool | None = None       # as ChatTask's
    owner: object = None
    streaming: Streaming = field(default_factory=lambda: Streaming(speculative=False))


@dataclass
class InfillTask:
    """Fill in the middle: the model's FIM tokens around ``prefix`` and ``suffix``, with
    ``extra`` files (``[{"filename", "text"}]``) before them and ``prompt`` after the
    middle token, laid out as llama.cpp's server does (``format_prompt_infill``)."""

    prefix: str = ""
    suffix: str = ""
    prompt: str = ""
    extra: list = field(default_factory=list)
    options: GenOptions = field(default_factory=GenOptions)
    keep_cache: bool | None = None       # as ChatTask's
    owner: object = None
    streaming: Streaming = field(default_factory=Streaming)


@dataclass
class TokenizeTask:
    """Text (or a list mixing text and token ids) -> token ids, optionally with pieces."""

    content: str | list
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


@dataclass
class DetokenizeTask:
    """Token ids -> text."""

    tokens: list


@dataclass
class TemplateTask:
    """The prompt text the chat template makes of a conversation (``/apply-template``);
    with ``tokens`` also its token ids, tokenized as a chat answer's prompt is
    (``count_tokens``)."""

    messages: list
    tools: list | None = None
    template_kwargs: dict | None = None
    continue_final: bool = False
    add_generation_prompt: bool = True
    tool_choice: str | dict = "auto"
    tokens: bool = False


@dataclass
class PropsTask:
    """What the loaded model is: path, context, template, special tokens (``/props``)."""


@dataclass
class EmbedTask:
    """Embeddings of each input (text or token ids) with the model's declared pooling;
    ``normalize`` as llama.cpp's ``embd_normalize``; ``pooled_only`` refuses pooling
    ``none`` (OpenAI's endpoint wants one vector per input)."""

    inputs: list
    normalize: int = 2
    pooled_only: bool = False


@dataclass
class RerankTask:
    """Relevance scores of ``documents`` for ``query`` from a reranking model."""

    query: str
    documents: list


@dataclass
class LogitsTask:
    """One prefill-only pass over ``input_ids`` (GenieX's ``/v1/logits``): the raw logits
    of the last position (``last_only``) or of every position, as the ``top_n`` largest
    with their log-probabilities, and each position's log-probability of the next input
    token (what perplexity needs). No sampling, no answer."""

    input_ids: list
    last_only: bool = True
    top_n: int = 20


@dataclass
class ForgetDrafts:
    """Make the drafters forget what they learned from earlier answers (and the KV cache)."""


@dataclass
class Piece:
    """Text released by one step of the loop, and the answer tokens it committed;
    ``timings`` (llama.cpp's names, so far) when the task asked for them per token.
    A chat answer's ``text`` is its content only: ``reasoning`` is the reasoning text
    it released and ``calls`` the tool calls read whole (OpenAI ``tool_calls`` items)."""

    text: str
    tokens: list
    timings: dict | None = None
    reasoning: str = ""
    calls: list = field(default_factory=list)
    logprobs: list | None = None         # a TokenText per token, when the task asked for them


@dataclass
class TokenText:
    """An answer token's log-probability with the bytes of it and of its ``top``
    alternatives (``(id, bytes, logprob)``, most likely first): what a response shows."""

    id: int
    bytes: bytes
    logprob: float
    top: list = field(default_factory=list)


@dataclass
class Progress:
    """How far the prompt's decoding got (llama.cpp's ``prompt_progress``)."""

    total: int
    cache: int
    processed: int
    time_ms: float
    timings: dict | None = None          # with timings_per_token (llama.cpp sends both)


@dataclass
class Result:
    """The answer of a task that does not decode an answer: plain JSON-able data."""

    data: object


@dataclass
class Done:
    """The end of a run: the answer's statistics (empty for a task that answers nothing)
    and the logit biases it sampled with (token ids; ``ignore_eos`` included)."""

    stats: Stats = field(default_factory=Stats)
    logit_bias: tuple = ()
    prompt_cache: dict | None = None     # the session's saved conversations (entries, bytes, restored), if any


def run(session, task, cancel=None):
    """Run ``task`` on ``session`` (a :class:`~geniex.engine.session.Session`), yielding
    events; ``cancel()`` turning true ends an answer at its next step."""
    kind = type(task)
    if kind is ForgetDrafts:
        session.reset(drafts=True)
        yield Done()
        return
    handler = _HANDLERS.get(kind)
    if handler is None:
        raise TypeError(f"not a task: {task!r}")
    if kind in _DECODING:
        yield from handler(session, task, cancel)
    else:
        yield Result(handler(session, task))
        yield Done()


# -- answers ----------------------------------------------------------------------------
def _chat(session, task, cancel):
    prompt = _render(session, task)
    tokens = session.tokenize_prompt(prompt)
    parser = _parser(session, task, prompt)
    if task.tools and (task.tool_choice == "required" or isinstance(task.tool_choice, dict)):
        task = _calls_enforced(task, parser.family)
    if task.reasoning_budget >= 0:
        task = _budgeted(session, task, prompt)
    for event in _decode(session, task, tokens, cancel):
        if isinstance(event, Piece):
            delta = parser.feed(event.text)
            # replace(): whatever else the piece carries (tokens, timings) goes on as it is.
            yield dataclasses.replace(event, text=delta.content, reasoning=delta.reasoning,
                                      calls=[c.openai() for c in delta.calls])
        elif isinstance(event, Done):
            delta = parser.finish()
            if delta:
                yield Piece(text=delta.content, tokens=[], reasoning=delta.reasoning,
                            calls=[c.openai() for c in delta.calls])
            yield event
        else:
            yield event


def _calls_enforced(task, family):
    """``task`` with its answer constrained to calls in ``family``'s format (tool_choice
    required or named: :mod:`geniex.engine.toolcalls.grammar`)."""
    if task.options.grammar is not None:
        raise UsageError("tool_choice: a required or named tool choice constrains the answer to calls, so it "
                         "cannot be combined with response_format or a grammar", param="tool_choice")
    name = task.tool_choice["function"]["name"] if isinstance(task.tool_choice, dict) else None
    grammar = toolcalls.grammar.call_grammar(family.name, task.tools, name, task.parallel_tool_calls)
    return dataclasses.replace(task, options=dataclasses.replace(task.options, grammar=grammar))


def _chat_template(session):
    """The session's chat template (its model's own, or ``--chat-template``'s)."""
    return template_for(session.model, session.options.chat_template)


def _budgeted(session, task, prompt):
    """``task`` with its reasoning held to ``reasoning_budget`` tokens
    (:mod:`geniex.engine.think_budget`)."""
    budget = think_budget.for_prompt(task.reasoning_budget, _chat_template(session).source, prompt,
                                     task.reasoning_budget_message, task.options.grammar, "thinking_budget_tokens")
    return dataclasses.replace(task, options=dataclasses.replace(task.options, think_budget=budget))


def _parser(session, task, prompt):
    """The answer's parser: tool calls in the template's family when the task has tools
    (and tool_choice is not "none"), reasoning split as ``reasoning_format`` says."""
    source = _chat_template(session).source
    family = toolcalls.family_of(source) if task.tools and task.tool_choice != "none" else None
    if family is not None and not _chat_template(session).renders_tools:
        family = toolcalls.FAMILIES["generic"]()     # the tools were described in the generic format
    markers = toolcalls.markers_for(source)
    return toolcalls.ChatParser(family, task.reasoning_format, markers, toolcalls.forced_open(prompt, markers),
                                streaming=task.streaming.stream, parallel=task.parallel_tool_calls)


def _complete(session, task, cancel):
    if isinstance(task.prompt, str):
        tokens = session.vocab.tokenize(task.prompt, add_special=session.vocab.add_bos)
    else:
        tokens = _token_ids(session, task.prompt, "prompt")
    if not tokens:
        raise UsageError("prompt: the prompt is empty", param="prompt")
    yield from _decode(session, task, tokens, cancel)


def _infill(session, task, cancel):
    vocab = session.vocab
    fim = vocab.fim
    if min(fim["pre"], fim["suf"], fim["mid"]) < 0:
        raise Unsupported(f"{session.name} has no fill-in-the-middle tokens (its GGUF declares no "
                          "tokenizer.ggml.fim_pre/suf/mid_token_id and its vocabulary has none llama.cpp "
                          "recognises), so it cannot answer /infill")
    tokenize = lambda text: vocab.tokenize(text, add_special=False, parse_special=False)
    extra = []
    if fim["rep"] >= 0 and task.extra:
        extra = [fim["rep"], *tokenize("myproject\n")]
        for chunk in task.extra:
            extra += [fim["sep"] if fim["sep"] >= 0 else fim["rep"], *tokenize(chunk.get("filename") or "tmp"),
                      *tokenize("\n" + (chunk.get("text") or ""))]
        extra += [fim["sep"] if fim["sep"] >= 0 else fim["rep"], *tokenize("filename\n")]
    prefix = [fim["pre"], *tokenize(task.prefix)]
    suffix = [fim["suf"], *tokenize(task.suffix)]
    tokens = ([vocab.bos] if vocab.add_bos and vocab.bos >= 0 else []) + extra + prefix + suffix + \
        [fim["mid"], *tokenize(task.prompt)]
    yield from _decode(session, task, tokens, cancel)


def _decode(session, task, tokens, cancel):
    """The loop over ``tokens`` for a decoding task: Progress, Piece and Done events, on
    the session or (a session with slots) the slot it seats the answer on."""
    with session.seat(tokens, task.owner, task.keep_cache, type(task).__name__) as seated:
        yield from _answer(seated, task, tokens, cancel)


def _answer(session, task, tokens, cancel):
    session.adopt(tokens, task.owner, task.keep_cache)
    options = _sampling_for(task.options, session)
    streaming = task.streaming
    t0 = time.perf_counter()
    reports = []

    def report(total, cache, done):
        ms = (time.perf_counter() - t0) * 1000
        timings = None
        if streaming.timings_per_token:
            timings = {"cache_n": cache, "prompt_n": done - cache, "prompt_ms": ms if done > cache else 0.0,
                       "prompt_per_second": (done - cache) / ms * 1000 if done > cache and ms > 0 else 0.0,
                       "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_second": 0.0}
        reports.append(Progress(total, cache, done, ms, timings))

    generation = session.generate(tokens, options, cancel=cancel, speculative=streaming.speculative,
                                  spec=streaming.spec,
                                  progress=report if streaming.progress else None)
    produced = 0
    for step in generation:
        yield from reports
        reports.clear()
        if step.text or step.committed:
            produced += len(step.committed)
            timings = _running(generation.stats, produced, t0) if streaming.timings_per_token else None
            logprobs = _token_texts(session.vocab, step.logprobs) if step.logprobs is not None else None
            yield Piece(step.text, step.committed, timings, logprobs=logprobs)
    yield from reports
    yield Done(generation.stats, options.sampling.logit_bias if options.sampling is not None else (),
               session.prompt_cache.status())


def _sampling_for(options, session):
    """The sampling settings with ``logit_bias`` keys as token ids (a text key biases
    each of its tokens, as llama.cpp) and ``ignore_eos`` as a -inf bias on the
    end-of-generation tokens (as llama.cpp)."""
    sampling = options.sampling
    if sampling is not None and sampling.dry:
        sampling = dataclasses.replace(sampling, dry_breakers=_breaker_tokens(session.vocab,
                                                                              sampling.dry_sequence_breakers))
        options = dataclasses.replace(options, sampling=sampling)
    if sampling is None or not (sampling.logit_bias or sampling.ignore_eos):
        return options
    vocab = session.vocab
    bias = []
    for key, value in sampling.logit_bias:
        tokens = vocab.tokenize(key, add_special=False, parse_special=False) if isinstance(key, str) else [key]
        bias += [(t, value) for t in _token_ids(session, tokens, "logit_bias")]
    if sampling.ignore_eos:
        bias += [(t, float("-inf")) for t in sorted(vocab.eog)]
    return dataclasses.replace(options, sampling=dataclasses.replace(sampling, logit_bias=tuple(bias)))


def _token_texts(vocab, rows):
    """The loop's TokenLogprob records with the bytes each token stands for."""
    piece = vocab.piece
    return [TokenText(r.token, piece(r.token), r.logprob, [(t, piece(t), lp) for t, lp in r.top]) for r in rows]


def _breaker_tokens(vocab, breakers):
    """DRY's sequence-breaker tokens: those whose text holds one of the (one-character)
    ``breakers``, as llama.cpp finds them."""
    if not breakers:
        return frozenset()
    marks = [b.encode("utf-8") for b in breakers]
    piece = vocab.piece
    return frozenset(t for t in range(vocab.n_tokens) if any(m in piece(t) for m in marks))


def _running(stats, produced, t0):
    """llama.cpp's ``timings`` so far, for ``timings_per_token``."""
    now = (time.perf_counter() - t0) * 1000
    prompt_ms = stats.prompt_time * 1000
    predicted_ms = max(now - prompt_ms, 1e-6)
    n = stats.prompt_tokens - stats.prompt_reused
    return {"cache_n": stats.prompt_reused, "prompt_n": n, "prompt_ms": prompt_ms,
            "prompt_per_second": n / prompt_ms * 1000 if prompt_ms > 0 else 0.0,
            "predicted_n": produced, "predicted_ms": predicted_ms,
            "predicted_per_second": produced / predicted_ms * 1000,
            "draft_n": stats.drafted, "draft_n_accepted": stats.accepted}


# -- answers at once --------------------------------------------------------------------
def _tokenize(session, task):
    vocab = session.vocab
    if isinstance(task.content, str):
        tokens = vocab.tokenize(task.content, add_special=task.add_special, parse_special=task.parse_special)
    else:
        tokens = []
        for i, part in enumerate(task.content):
            if isinstance(part, str):
                tokens += vocab.tokenize(part, add_special=task.add_special and i == 0,
                                         parse_special=task.parse_special)
            else:
                tokens += _token_ids(session, [part], "content")
    if not task.with_pieces:
        return {"tokens": tokens}
    out = []
    for t in tokens:
        raw = vocab.piece(t)
        try:
            piece = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)            # not text on its own: its bytes, as llama.cpp gives them
        out.append({"id": t, "piece": piece})
    return {"tokens": out}


def _detokenize(session, task):
    return {"content": session.vocab.detokenize(_token_ids(session, task.tokens, "tokens"))}


def _template(session, task):
    prompt = _render(session, task)
    if task.tokens:
        return {"prompt": prompt, "tokens": session.tokenize_prompt(prompt)}
    return {"prompt": prompt}


def _props(session, task):
    model, vocab = session.model, session.vocab
    pooling = embedding.declared_pooling(model)
    return {
        "model_path": str(model.path), "n_ctx": session.n_ctx, "n_ctx_train": model.n_ctx_train,
        "n_vocab": vocab.n_tokens, "n_embd": model.n_embd, "n_params": model.n_params,
        "size": model.size_bytes, "description": model.describe(),
        "chat_template": model.chat_template() or "",
        "bos_token": vocab.detokenize([vocab.bos]) if vocab.bos >= 0 else "",
        "eos_token": vocab.detokenize([vocab.eos]) if vocab.eos >= 0 else "",
        "fim": min(vocab.fim["pre"], vocab.fim["suf"], vocab.fim["mid"]) >= 0,
        "pooling": None if pooling is None else api.POOLING_NAMES.get(pooling, str(pooling)),
        "speculative": session.speculative, "spec_types": list(session.options.spec.types),
    }


def _embed(session, task):
    pooling = embedding.require_pooling(session.model, session.name)
    if task.pooled_only and pooling == api.LLAMA_POOLING_TYPE_NONE:
        raise UsageError(f"{session.name} declares pooling none (a vector per token), which OpenAI's "
                         "embeddings endpoint cannot return; use /embeddings", param="input")
    return session.compute(_embed_inputs, session, task, pooling)    # one embeddings context, one batch


def _embed_inputs(session, task, pooling):
    ctx = session.embeddings_context()
    out = []
    for i, item in enumerate(task.inputs):
        field_name = f"input[{i}]" if len(task.inputs) > 1 else "input"
        if isinstance(item, str):
            tokens = session.vocab.tokenize(item, add_special=True, parse_special=True)
        else:
            tokens = _token_ids(session, item, field_name)
        vecs = embedding.vectors(ctx, session.batch, tokens, session.model.n_embd, field_name)
        out.append({"embedding": [embedding.normalize(v, task.normalize).tolist() for v in vecs],
                    "tokens": len(tokens)})
    return {"data": out, "pooling": api.POOLING_NAMES.get(pooling, str(pooling))}


def _rerank(session, task):
    embedding.require_rank(session.model, session.name)
    return session.compute(_rank, session, task)


def _rank(session, task):
    vocab = session.vocab
    ctx = session.embeddings_context()
    sep = vocab.eos
    query = vocab.tokenize(task.query, add_special=False, parse_special=False)
    out = []
    for i, doc in enumerate(task.documents):
        # llama.cpp's layout without a rerank template: [BOS]query[EOS][SEP]doc[EOS]
        tokens = ([vocab.bos] if vocab.bos >= 0 else []) + query + [vocab.eos, sep] + \
            vocab.tokenize(doc, add_special=False, parse_special=False) + [vocab.eos]
        vec = embedding.vectors(ctx, session.batch, tokens, session.model.n_cls_out, f"documents[{i}]")[0]
        out.append({"index": i, "relevance_score": float(vec[0]), "tokens": len(tokens)})
    return {"results": out}


def _logits(session, task):
    ids = _token_ids(session, task.input_ids, "input_ids")
    with session.seat(ids, object(), False, "LogitsTask") as seated:   # a slot of its own, reset before and after
        return _logits_on(seated, task, ids)


def _logits_on(session, task, ids):
    ctx, batch = session.ctx, session.batch
    n = len(ids)
    if not n:
        raise UsageError("input_ids: empty", param="input_ids")
    if n > ctx.n_ctx:
        raise ContextLengthExceeded(f"input_ids has {n} tokens but the context holds {ctx.n_ctx}; raise --nctx or "
                                    "send fewer", n_prompt_tokens=n, n_ctx=ctx.n_ctx)
    session.reset()                 # the pass starts at position 0 on a clean cache
    rows = []

    def record(row, pos):
        nxt = ids[pos + 1] if pos + 1 < n else None
        rec = logprobs.read(row, nxt if nxt is not None else 0, task.top_n)
        rows.append({"index": pos, "token_id": ids[pos], "next_token_logprob": rec.logprob if nxt is not None else None,
                     "top": [{"token_id": t, "logit": float(row[t]), "logprob": lp} for t, lp in rec.top]})

    def on_rows(logits, pos, count):
        for i in range(count):
            record(logits(i), pos + i)
    try:
        # The way an answer reads a prompt (geniex.engine.loop): every position but the
        # last as the session reads prompts, the last one decoded on the target, so the
        # last row is the one an answer's first token is sampled from.
        kv = session.kv
        kv.sync(ids, keep_at_most=n - 1)
        kv.fill(batch, ids, 0, n - 1, on_rows=None if task.last_only else on_rows)
        ctx.decode(batch.fill(ids[n - 1:], n - 1))
        record(ctx.logits(0), n - 1)
    finally:
        session.reset()             # nothing of this pass is a conversation to continue
    return {"n_tokens": n, "n_vocab": session.vocab.n_tokens, "data": rows}


# -- shared pieces ----------------------------------------------------------------------
def _render(session, task):
    """The prompt text of a chat or template task's messages; with ``continue_final`` it
    ends with the last (assistant) message's text, so the answer continues it."""
    template = _chat_template(session)
    messages = task.messages
    # tool_choice "none": the model is not shown the tools (so it does not call them).
    tools = task.tools if task.tool_choice != "none" else None
    if tools and not template.renders_tools:
        messages = toolcalls.tools.with_tools_described(messages, tools)
    if not task.continue_final:
        return template.render(messages, add_assistant=task.add_generation_prompt, tools=tools,
                               extra=task.template_kwargs)
    text = template.render(messages, add_assistant=False, tools=tools, extra=task.template_kwargs)
    last = messages[-1].get("content") or ""
    cut = text.rfind(last) if last else -1
    if cut < 0:
        raise GenieXError("the chat template does not show the final assistant message as it was sent, "
                          "so it cannot be continued", param="messages")
    return text[:cut + len(last)]


def _token_ids(session, tokens, field_name):
    """Token ids from a request, checked against the vocabulary (an id out of range would
    make the library read outside its tables)."""
    n = session.vocab.n_tokens
    for i, t in enumerate(tokens):
        if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < n:
            raise UsageError(f"{field_name}[{i}]: {t!r} is not a token id of this model (0..{n - 1})",
                             param=field_name)
    return list(tokens)


_HANDLERS = {ChatTask: _chat, CompletionTask: _complete, InfillTask: _infill, TokenizeTask: _tokenize,
             DetokenizeTask: _detokenize, TemplateTask: _template, PropsTask: _props, EmbedTask: _embed,
             RerankTask: _rerank, LogitsTask: _logits}
_DECODING = (ChatTask, CompletionTask, InfillTask)
