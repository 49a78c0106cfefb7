"""``geniex infer [MODEL]``: answer ``-p`` prompts, or chat interactively without ``-p``."""
import logging
import sys

from geniex import config, profile
from geniex.cli import console
from geniex.cli.options import add_chat_verb, gen_options, load_options, template_kwargs
from geniex.errors import Cancelled, GenieXError, UsageError
from geniex.speculative.options import FALLBACK, parse_types

log = logging.getLogger("geniex.cli")


def register(sub):
    """Add ``infer`` to the CLI."""
    p = add_chat_verb(sub, "infer", run, help="answer prompts with a local model (interactive without -p)",
                      description="Answer prompts with a local GGUF model. Without -p, opens an interactive "
                                  "chat that keeps the conversation and its KV cache.",
                      spec_trace="write one JSON line per decoding step ('-' = stderr)")
    p.add_argument("-t", "--token-file", metavar="PATH",
                   help="a raw prompt as token ids (whitespace or comma separated, or a JSON list), "
                        "answered without the chat template; instead of -p/-i")
    p.add_argument("--reasoning-budget-message", default="", metavar="TEXT",
                   help="text put before the closing marker when --reasoning-budget runs out (default none)")


def _resolve_models(args, store):
    """The target, and the draft's path (None with the fallback warning when it cannot
    be had, as every other speculative setup failure)."""
    from geniex.store import DEMO_NAME
    model = store.resolve(args.model or DEMO_NAME, pull_missing=True)
    draft_path = None
    if args.draft_model:
        if not parse_types(args.spec_type):
            log.warning("--draft-model has no effect without --spec-type")
        else:
            try:
                draft_path = store.resolve(args.draft_model, pull_missing=True).path
            except GenieXError as e:
                log.warning("%s: resolve draft model %s: %s", FALLBACK, args.draft_model, e)
                args.spec_type = ""
    return model, draft_path


def run(args):
    """Entry point of ``geniex infer``."""
    from geniex.engine.chat import Conversation
    from geniex.engine.session import open_session
    from geniex.store import Store
    opts = gen_options(args)
    turns = console.prompts(args)
    token_prompt = None
    if args.token_file:
        if turns:
            raise UsageError("--token-file is a whole prompt: give it without -p/-i")
        token_prompt = read_token_file(args.token_file)
    store = Store(config.data_dir(getattr(args, "data_dir", None)))
    model, draft_path = _resolve_models(args, store)
    verbose = getattr(args, "verbose", False)
    session = open_session(model, load_options(args, draft_path))
    tracer = None
    try:
        if verbose:
            print(f"model: {model.name} ({session.model.describe()}); {session.device_note}; "
                  f"context {session.ctx.n_ctx} tokens; threads {session.threads}/{session.threads_batch}; "
                  f"KV cache {session.options.cache_type_k}/{session.options.cache_type_v}; "
                  + ("prompts read in an F16 cache" if session.reader is not None else
                     f"prompts decoded on it ({session.reader_note or '--prompt-kv none'})"),
                  file=sys.stderr)
            for note in session.spec_notes:
                if not note.startswith(FALLBACK):      # already logged as a warning
                    print(note, file=sys.stderr)
        if args.spec_trace:
            from geniex.speculative.trace import Tracer
            try:
                tracer = Tracer(args.spec_trace, session.vocab)
            except OSError as e:
                raise UsageError(f"--spec-trace {args.spec_trace}: {e.strerror}") from None
        if token_prompt is not None:
            with console.CtrlC() as ctrl:
                _answer_tokens(session, token_prompt, opts, ctrl, tracer, verbose)
            return 0
        # Which chat template is used is logged once per model (shown by --verbose).
        chat = Conversation(session, args.system_prompt, template_kwargs(args), args.reasoning_budget,
                            args.reasoning_budget_message)
        with console.CtrlC() as ctrl:
            answer = lambda text: _answer(chat, text, opts, ctrl, tracer, verbose)  # noqa: E731
            if turns:
                for turn in turns:
                    answer(turn)
            else:
                console.interactive(answer, lambda: _clear(chat))
    except KeyboardInterrupt:
        print(file=sys.stderr)
    finally:
        if tracer is not None:
            tracer.close()
        session.close()
    return 0


def read_token_file(path):
    """``-t/--token-file``: token ids separated by whitespace or commas (a JSON list
    reads the same way); checked against the vocabulary once the model is loaded."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"--token-file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--token-file {path}: not UTF-8 text") from None
    words = text.replace(",", " ").replace("[", " ").replace("]", " ").split()
    try:
        tokens = [int(w) for w in words]
    except ValueError:
        bad = next(w for w in words if not w.lstrip("-").isdigit())
        raise UsageError(f"--token-file {path}: {bad!r} is not a token id (expected integers)") from None
    if not tokens:
        raise UsageError(f"--token-file {path}: no token ids in it")
    return tokens


def _answer_tokens(session, tokens, opts, ctrl, tracer, verbose):
    """Continue a raw prompt of token ids (no chat template), as /v1/completions does."""
    n = session.vocab.n_tokens
    bad = [t for t in tokens if not 0 <= t < n]
    if bad:
        raise UsageError(f"--token-file: {bad[0]} is not a token id of this model (0..{n - 1})")
    session.reset()
    ctrl.answering = True
    try:
        gen = session.generate(tokens, opts, cancel=ctrl.cancelled)
        for step in gen:
            if step.text:
                sys.stdout.write(step.text)
                sys.stdout.flush()
            if tracer is not None:
                tracer.step(step)
    finally:
        ctrl.answering = False
    sys.stdout.write("\n")
    sys.stdout.flush()
    if tracer is not None:
        tracer.summary(gen.stats)
    print(profile.render(gen.stats, verbose), file=sys.stderr, flush=True)


def _answer(chat, prompt, opts, ctrl, tracer, verbose):
    ctrl.pressed = False
    ctrl.answering = True
    try:
        gen = chat.ask(prompt, opts, cancel=ctrl.cancelled)
        out = sys.stdout
        for step in gen:
            if step.text:
                out.write(step.text)
                out.flush()
            if tracer is not None:
                tracer.step(step)
    except Cancelled as e:
        # Ctrl-C while a long prompt was decoded: no answer, and the turn is forgotten.
        chat.messages.pop()
        print(f"(stopped while reading the prompt: {e})", file=sys.stderr, flush=True)
        return
    finally:
        ctrl.answering = False
    chat.finish(gen)
    out.write("\n")
    out.flush()
    if tracer is not None:
        tracer.summary(gen.stats)
    print(profile.render(gen.stats, verbose), file=sys.stderr, flush=True)


def _clear(chat):
    chat.messages = [m for m in chat.messages if m["role"] == "system"]
    chat.session.reset(drafts=True)
