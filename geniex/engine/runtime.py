"""A loaded model ready to answer: the one object the CLI and the server both hold.

:class:`Session` loads the target, creates its context, builds the speculative
drafters right after the context and before anything is decoded (the MTP assistant
must be wired to a fresh target context), and answers prompts through the one loop in
:mod:`geniex.engine.loop`. It remembers which tokens are in the KV cache so that a
follow-up prompt decodes only what is new.
"""
import logging
from dataclasses import dataclass, field

from geniex.config import physical_cores
from geniex.engine import loop
from geniex.engine.stats import Stats
from geniex.errors import GenieXError
from geniex.llama import devices as devmod
from geniex.llama import library
from geniex.llama.gguf_file import read_header
from geniex.llama.objects import Batch, Context, Model

log = logging.getLogger("geniex.engine")


@dataclass
class SpecOptions:
    """Speculative decoding settings (``--spec-type`` and friends / ``spec_*`` fields)."""

    types: tuple = ()                # e.g. ("ngram-mod",) or ("draft-mtp",)
    draft_model: str = ""            # as the user wrote it (for messages)
    draft_path: object = None        # resolved GGUF path of the draft model, if any
    n_max: int = 3                   # --draft-tokens
    n_min: int = 0                   # --draft-min
    p_min: float = 0.0               # --draft-p-min
    ngram_n: int = 0                 # ngram match length (0 = method default)
    ngram_min: int = 0               # ngram minimum draft (0 = method default)
    ngram_max: int = 0               # ngram maximum draft (0 = method default)

    @property
    def enabled(self):
        return bool(self.types)

    def key(self):
        """What identifies this configuration in the server's model cache."""
        return (tuple(self.types), str(self.draft_path or self.draft_model), self.n_max, self.n_min,
                self.p_min, self.ngram_n, self.ngram_min, self.ngram_max)


@dataclass
class LoadOptions:
    """How to load a model: ``--nctx``, ``--ngl``, ``--compute``, threads, speculation."""

    nctx: int = 4096
    ngl: int = -1
    compute: str | None = None
    threads: int = 0                 # one-row decodes (0 = auto, see README "Identical output")
    threads_batch: int = 0           # multi-row batches (0 = physical cores)
    n_ubatch: int = 32
    spec: SpecOptions = field(default_factory=SpecOptions)


class Session:
    """A target model and context, its drafters, and the KV cache's token history."""

    def __init__(self, path, options=None, *, name=None):
        self.options = options = options or LoadOptions()
        if options.nctx is None or options.nctx < 1:
            raise GenieXError(f"--nctx must be a positive number of tokens (got {options.nctx})")
        lib = library.load()
        header = read_header(path)
        chosen, why = devmod.select(options.compute, devmod.available(lib))
        self.device_note = why
        log.debug(why)
        self.name = name or str(path)
        # draft-mtp without a draft model drafts with the NextN layers bundled in the target.
        self.bundled_nextn = _wants_bundled_nextn(header, options.spec)
        self.model = Model(path, devices=chosen, n_gpu_layers=options.ngl, header=header,
                           load_mtp=self.bundled_nextn)
        cores = physical_cores()
        self.threads = options.threads or _default_threads(cores)
        self.threads_batch = options.threads_batch or cores
        # Recurrent and hybrid targets (Qwen3.5: gated delta-net layers) can roll their
        # state back only as far as they keep snapshots: one per position a verify may
        # reject, i.e. the longest draft any requested method can make.
        from geniex.speculative.setup import longest_draft
        self.n_rs_seq = longest_draft(options.spec) if self.model.recurrent else 0
        self.ctx = Context(self.model, n_ctx=options.nctx, n_batch=512, n_ubatch=options.n_ubatch,
                           n_threads=self.threads, n_threads_batch=self.threads_batch,
                           n_rs_seq=self.n_rs_seq)
        self.vocab = self.model.vocab
        self.kv_tokens = []
        self.drafter = None
        self.spec_notes = []
        if options.spec.enabled:
            from geniex.speculative import setup
            self.drafter, self.spec_notes = setup.build(self, options.spec)
        self.batch = Batch(max(512, (self.drafter.cap if self.drafter else 0) + 1))
        self._warm_up()

    def _warm_up(self):
        # The first decode pays for graph allocation and weight repacking; do it at load
        # (as llama.cpp's tools do) so time-to-first-token measures the answer. The MTP
        # draft context already exists: it must be made before the target decodes.
        tok = self.vocab.bos if self.vocab.bos >= 0 else 0
        self.ctx.decode(self.batch.fill([tok], 0))
        self.ctx.clear()

    # -- KV bookkeeping ----------------------------------------------------------
    def sync_kv(self, tokens, keep_at_most):
        """Keep the longest cached prefix of ``tokens`` (at most ``keep_at_most``),
        drop the rest of the KV cache, and return how many positions were kept."""
        keep = min(loop.common_prefix(self.kv_tokens, tokens), keep_at_most)
        if not self.ctx.try_trim(keep):
            # A recurrent state cannot go back that far: start this prompt from scratch.
            self.ctx.clear()
            keep = 0
        self.kv_tokens = self.kv_tokens[:keep]
        return keep

    def reset(self):
        """Forget the conversation: the next prompt is decoded from scratch."""
        self.ctx.clear()
        self.kv_tokens = []

    # -- answering ---------------------------------------------------------------
    def tokenize_prompt(self, text):
        """A complete prompt (already templated) -> tokens, with BOS where the model
        wants one and the template did not already put it."""
        tokens = self.vocab.tokenize(text, add_special=self.vocab.add_bos, parse_special=True)
        if len(tokens) >= 2 and tokens[0] == tokens[1] == self.vocab.bos:
            tokens = tokens[1:]
        return tokens

    def generate(self, prompt_tokens, opts, cancel=None, speculative=True):
        """Start answering; returns a :class:`Generation` to iterate."""
        drafter = self.drafter if speculative else None
        # Each drafter caps its own drafts (--draft-tokens for model drafters, the n-gram
        # maximum for n-gram methods); the loop needs the largest.
        opts.n_max = drafter.cap if drafter is not None else 0
        opts.n_min = self.options.spec.n_min
        return Generation(self, prompt_tokens, opts, drafter, cancel)

    @property
    def speculative(self):
        return self.drafter is not None

    def close(self):
        """Free drafters, context and model (in that order: the MTP draft reads the target)."""
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
        if getattr(self, "model", None) is not None:
            self.model.close()


def open_session(model, options):
    """Open a Session on a store-resolved model (a ResolvedModel), applying GenieX's
    rules for runtimes and multimodal models. The CLI and the server both call this."""
    if model.runtime != "llama_cpp":
        if options.spec.enabled:
            log.warning("speculative decoding is only supported by llama_cpp")
        raise GenieXError(f"{model.name} uses the {model.runtime} runtime (a QAIRT bundle for "
                          "Qualcomm's own runner), which geniex cannot run; use a GGUF model")
    if model.type == "vlm" and options.spec.enabled:
        log.warning("%s is multimodal: speculative decoding runs the text path, and image/audio "
                    "content is dropped", model.name)
    return Session(model.path, options, name=model.name)


# Architectures with a NextN draft graph (``graph_mtp``) in the b11549 library; only
# qwen35 is exercised by tests (tools/tiny_nextn.py).
NEXTN_ARCHS = frozenset((
    "qwen35", "qwen35moe", "qwen3next", "qwen4exp", "glm4moe", "glm-dsa", "glm5-next",
    "deepseek2", "deepseek32", "deepseek4", "mimo2", "step35", "hy_v3", "cohere2moe",
    "bailingmoe3", "nemotron_h_moe"))


def _wants_bundled_nextn(header, spec):
    """Whether to load the target's NextN layers: draft-mtp, no draft model, and the GGUF
    declares ``{arch}.nextn_predict_layers`` > 0."""
    if "draft-mtp" not in spec.types or spec.draft_path or header.architecture not in NEXTN_ARCHS:
        return False
    try:
        return int(header.arch_key("nextn_predict_layers") or 0) > 0
    except (TypeError, ValueError):
        return False


def _default_threads(cores):
    # One-row decodes on one thread keep every verify-batch row bitwise equal to a
    # one-row decode (README, "Identical output"); measured cost on 2 cores: see README.
    return 1


class Generation:
    """One answer in progress: iterate for :class:`~geniex.engine.loop.Step` records."""

    def __init__(self, session, prompt_tokens, opts, drafter, cancel):
        self.session = session
        self.stats = Stats(spec_types=tuple(session.options.spec.types) if drafter else ())
        self.tokens = []
        self._parts = []
        self._steps = loop.steps(session, prompt_tokens, opts, drafter, cancel, self.stats)

    def __iter__(self):
        for step in self._steps:
            self.tokens.extend(step.committed)
            if step.text:
                self._parts.append(step.text)
            yield step

    def run(self):
        """Consume the whole answer; returns its text."""
        for _ in self:
            pass
        return self.text

    @property
    def text(self):
        return "".join(self._parts)
