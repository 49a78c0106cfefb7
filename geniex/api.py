"""A small Python API over the engine, for notebooks and debuggers.

    import geniex.api as gx
    session = gx.load("demo", spec_type="ngram-mod")
    for step in gx.steps(session, "Repeat: the quick brown fox", max_tokens=32):
        print(step.n_past, step.drafted, step.target, step.accepted, step.committed)

Each :class:`~geniex.engine.loop.Step` is one target decode of the accept loop; a
breakpoint inside the ``for`` stops between steps with the loop's state in hand.
"""
from geniex import config
from geniex.engine.chat import Conversation
from geniex.engine.loop import GenOptions
from geniex.engine.sampling import SamplingParams
from geniex.engine.session import load_options, open_session
from geniex.speculative import options as spec_options


def load(model="demo", *, nctx=4096, ngl=-1, compute=None, threads=0, data_dir=None, **spec):
    """Open a Session on a store name or GGUF path, with optional speculative decoding.

    ``spec`` takes the speculative settings by their flag names (``spec_type``,
    ``draft_model``, ``draft_tokens``, ``draft_min``, ``draft_p_min``, ``ngram_n``,
    ``ngram_min``, ``ngram_max``: see :data:`geniex.speculative.options.FIELDS`).
    Names resolve through the same store as the CLI (nothing is downloaded here: pull
    with ``geniex pull`` first). The context size is checked as ``geniex infer`` checks
    it (:func:`~geniex.engine.session.open_session`).
    """
    from geniex.store import Store
    store = Store(config.data_dir(data_dir))
    resolved = store.resolve(model)
    draft = spec.get("draft_model")
    draft_path = store.resolve(draft).path if draft else None
    options = load_options(dict(nctx=nctx, ngl=ngl, compute=compute, threads=threads), data_dir=data_dir,
                           spec=spec_options.from_kwargs(spec, draft_path))
    return open_session(resolved, options)


def chat(session, system_prompt=None):
    """A :class:`~geniex.engine.chat.Conversation` on ``session``."""
    return Conversation(session, system_prompt)


def steps(session, prompt, *, max_tokens=256, stop=(), temperature=0.0, seed=0, **sampling):
    """Answer one chat turn, yielding each loop Step; the last has ``.stop`` set."""
    conv = Conversation(session)
    opts = GenOptions(max_tokens=max_tokens, stop=tuple(stop),
                      sampling=SamplingParams(temperature=temperature, seed=seed, **sampling))
    gen = conv.ask(prompt, opts)
    yield from gen
