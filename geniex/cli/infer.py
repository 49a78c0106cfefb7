"""``geniex infer [MODEL]``: answer ``-p`` prompts, or chat interactively without ``-p``."""
import logging
import sys

from geniex import config, profile
from geniex.cli import console
from geniex.cli.options import add_chat_verb, gen_options, load_options
from geniex.errors import Cancelled, GenieXError, UsageError
from geniex.speculative.options import FALLBACK, parse_types

log = logging.getLogger("geniex.cli")


def register(sub):
    """Add ``infer`` to the CLI."""
    add_chat_verb(sub, "infer", run, help="answer prompts with a local model (interactive without -p)",
                  description="Answer prompts with a local GGUF model. Without -p, opens an interactive "
                              "chat that keeps the conversation and its KV cache.",
                  spec_trace="write one JSON line per decoding step ('-' = stderr)")


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
    store = Store(config.data_dir(getattr(args, "data_dir", None)))
    model, draft_path = _resolve_models(args, store)
    verbose = getattr(args, "verbose", False)
    session = open_session(model, load_options(args, draft_path))
    tracer = None
    try:
        if verbose:
            print(f"model: {model.name} ({session.model.describe()}); {session.device_note}; "
                  f"context {session.ctx.n_ctx} tokens; threads {session.threads}/{session.threads_batch}; "
                  f"KV cache {session.options.cache_type_k}/{session.options.cache_type_v}",
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
        # Which chat template is used is logged once per model (shown by --verbose).
        chat = Conversation(session, args.system_prompt)
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
