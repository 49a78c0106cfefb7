"""A loaded model ready to answer: the one object the CLI and the server both hold.

:class:`Session` loads the target, creates its context, builds the speculative
drafters right after the context and before anything is decoded (the MTP assistant
must be wired to a fresh target context), and answers prompts through the one loop in
:mod:`geniex.engine.loop`. It remembers which tokens are in the KV cache so that a
follow-up prompt decodes only what is new.
"""
import contextlib
import dataclasses
import logging
import threading
from dataclasses import dataclass, field

from geniex import config
from geniex.config import physical_cores
from geniex.engine import limits, loop, prompt_reader
from geniex.engine.prompt_cache import MIN_TOKENS, PromptCache
from geniex.engine.stats import Stats
from geniex.errors import GenieXError, UsageError
from geniex.llama import cache_types, kv_state
from geniex.llama import devices as devmod
from geniex.llama import library
from geniex.llama.gguf_file import check_tokenizer
from geniex.llama.kv import KvHistory, common_prefix
from geniex.llama.objects import Batch, Context, Model
from geniex.llama.threads import ThreadGovernor
from geniex.speculative import build, per_answer, policy
from geniex.speculative.drafters.base import NO_DRAFTER, DrafterChain
from geniex.speculative.drafters.prediction import PredictionDrafter
from geniex.speculative.options import SpecOptions
from geniex.speculative.target import Target

log = logging.getLogger("geniex.engine")

# Rows of the target context's batch: a verify batch (the pending token plus its drafts)
# never holds more (a prompt is decoded in chunks of geniex.llama.kv.PROMPT_CHUNK).
N_BATCH = 512
# The micro-batch of an F16/F32 KV cache: under 64 rows, where its verify rows keep the
# kernels of one-row decodes (docs/speculative.md, "Identical output").
EXACT_F16_UBATCH = 32


@dataclass
class LoadOptions:
    """How to load a model: ``--nctx``, ``--ngl``, ``--compute``, threads, speculation."""

    nctx: int = 4096
    ngl: int = -1
    compute: str | None = None
    threads: int = 0                 # one-row decodes (0 = every physical core it may run on)
    threads_batch: int = 0           # multi-row batches (0 = the same)
    # A quantized KV cache keeps one-row decodes on every core bitwise equal to verify
    # rows (docs/speculative.md, "Identical output"); llama.cpp's names, as -ctk/-ctv take them.
    cache_type_k: str = "q8_0"
    cache_type_v: str = "q8_0"
    # Rows per micro-batch; 0: the batch's 512 where the cache type makes rows the same
    # bits in a batch of any size (a prompt then decodes at llama.cpp's pace), else 32 (an
    # F16 cache takes a tiled kernel from 64 rows, which a one-row decode never matches).
    n_ubatch: int = 0
    adaptive_threads: bool = True    # drop to one thread while a neighbour stalls decodes
    data_dir: object = None          # where measured verify costs are cached (None: the default)
    memory_budget: int | None = None  # bytes the KV cache may take (None: limits.default_budget())
    cache_ram: int = 0               # bytes of conversations kept in host memory (serve --cache-ram)
    # Conversations answered at once (serve --parallel): each slot is a sequence of the
    # target context with a KV stream of nctx tokens, so the KV cache is parallel x nctx.
    parallel: int = 1
    # The KV type prompts are read with (geniex.engine.prompt_reader): "f16", in a context
    # of its own whose cells move to the target's quantized cache (1.7x faster prompts on
    # CPU, F16 KV memory on top), or "none": prompts decode on the target's cache.
    prompt_kv: str = "f16"
    # The chat template in place of the model's own (--chat-template): a built-in format's
    # name or Jinja text (geniex.engine.chat.template_choice); None: the model's.
    chat_template: str | None = None
    spec: SpecOptions = field(default_factory=SpecOptions)


# What a caller may set from outside: flags (infer, run), request fields (the server),
# keywords (geniex.api.load).
LOAD_FIELDS = ("nctx", "ngl", "compute", "threads", "cache_type_k", "cache_type_v", "prompt_kv", "chat_template")
# The load settings a server request may set (the server fixes its threads, how it
# reads prompts and its chat template at start).
REQUEST_LOAD_FIELDS = tuple(f for f in LOAD_FIELDS if f not in ("threads", "prompt_kv", "chat_template"))
PROMPT_KV = ("f16", "none")      # LoadOptions.prompt_kv


def load_options(*layers, spec=None, data_dir=None, memory_budget=None, cache_ram=0, parallel=1):
    """The one place LoadOptions are built from a caller's values: each layer (a
    mapping, e.g. ``vars(args)``, a request body, or the server's defaults) sets the
    :data:`LOAD_FIELDS` it names with a value other than None, later layers over
    earlier ones; the rest keep LoadOptions' defaults. Cache type names are
    case-insensitive."""
    values = {}
    for layer in layers:
        values.update({name: layer[name] for name in LOAD_FIELDS if layer.get(name) is not None})
    for name in ("cache_type_k", "cache_type_v", "prompt_kv"):
        if name in values:
            values[name] = values[name].lower()
    if values.get("prompt_kv", "f16") not in PROMPT_KV:
        raise UsageError(f"--prompt-kv {values['prompt_kv']}: expected one of {', '.join(PROMPT_KV)}")
    return LoadOptions(**values, data_dir=data_dir, memory_budget=memory_budget, cache_ram=cache_ram,
                       parallel=parallel, spec=spec or SpecOptions())


class Session:
    """A target model and context, its drafters, and the KV cache's token history.

    Open one with :func:`open_session` (it checks the context size and memory first);
    constructing it directly skips those checks (tests of the engine do)."""

    def __init__(self, path, options=None, *, name=None, submit=None):
        """``submit(fn)``, with slots: runs ``fn`` on the thread that loads the model (the
        slots' decodes then run on it, geniex.engine.batcher); None: a thread of the
        session's own."""
        self.options = options = options or LoadOptions()
        self._submit = submit
        if options.nctx is None or options.nctx < 1:
            raise GenieXError(f"--nctx must be a positive number of tokens (got {options.nctx})")
        self.name = name or str(path)
        self._load_model(path)
        self._make_context()
        self._build_drafters()
        self._make_reader()
        self.batch = Batch(N_BATCH)
        self._embd = None                # the embeddings context, made on first use
        self.embd_lock = threading.Lock()  # held by an embeddings task (a server's slots run tasks at once)
        self._warm_up()
        governor = self._thread_governor()
        self.policy = self._draft_policy(governor)
        if governor is not None:
            governor.settle(self._decode_one)
        self.ctx.governor = governor
        self.slots = None
        if self.options.parallel > 1:
            from geniex.engine.slots import Slots
            # A slot never measures on the shared context: the costs a prediction's
            # policy needs are measured now, before any answer.
            self.verify_costs = self._verify_cost(self.threads, self.threads_batch)
            self.slots = Slots(self, self.batcher, self._views, self._slot_drafters, self.policy, N_BATCH)

    def _load_model(self, path):
        """The library, the devices ``--compute`` picks, and the target model (with its
        bundled NextN layers when draft-mtp has no draft model)."""
        options = self.options
        lib = library.load()
        # Read (and checked) once per version of the file: open_session's context check
        # has usually just read it (limits.header_of keeps it by path, size and mtime).
        header = limits.header_of(path)
        check_tokenizer(header)          # the model that reads prompts must have a tokenizer
        chosen, self.device_note = devmod.select(options.compute, devmod.available(lib))
        log.debug(self.device_note)
        self.bundled_nextn = _wants_bundled_nextn(header, options.spec)
        self.model = Model(path, devices=chosen, n_gpu_layers=options.ngl, header=header,
                           load_mtp=self.bundled_nextn)
        self.vocab = self.model.vocab

    def _make_context(self):
        """Thread counts, the target context and the KV cache's token history."""
        options = self.options
        cores = physical_cores()
        self.threads = options.threads or cores
        self.threads_batch = options.threads_batch or cores
        # Recurrent and hybrid targets (Qwen3.5: gated delta-net layers) can roll their
        # state back only as far as they keep snapshots: one per position a verify may
        # reject, i.e. the longest draft any requested method can make.
        self.n_rs_seq = min(options.spec.longest_draft(), N_BATCH - 1) if self.model.recurrent else 0
        slots = max(1, options.parallel)
        # With slots, each is a sequence with a KV stream of its own (kv_unified off):
        # n_ctx is theirs together, and a decode may hold every slot's rows.
        # The library gives each sequence n_ctx / slots cells, a multiple of 256.
        stream = options.nctx if slots == 1 else -(-options.nctx // 256) * 256
        self.ctx = Context(self.model, n_ctx=stream * slots, n_batch=N_BATCH * slots,
                           n_ubatch=self._micro_batch(), n_seq_max=slots,
                           n_threads=self.threads, n_threads_batch=self.threads_batch,
                           n_rs_seq=self.n_rs_seq, type_k=options.cache_type_k,
                           type_v=options.cache_type_v)
        self.batcher, self._views = None, []
        if slots > 1:
            from geniex.engine.batcher import Batcher, SlotView
            self.batcher = Batcher(self.ctx, slots, self._submit)
            self._views = [SlotView(self.batcher, seq, options.nctx, N_BATCH) for seq in range(slots)]
        self.kv = KvHistory(self.ctx)
        self.kv_owner = None             # whose conversation the KV cache holds (a server's API key)
        self.prompt_cache = PromptCache(options.cache_ram)
        # Whether a cached prefix is what a fresh prefill would write (a quantized cache).
        self.reuse_exact = cache_types.shape_free(self.ctx.type_k, self.ctx.type_v)
        self.target = Target(self.name, self.model, self.ctx, self.threads, self.threads_batch, options.ngl,
                             options.cache_type_k, options.cache_type_v)

    def _micro_batch(self):
        """LoadOptions.n_ubatch as the context takes it (see LoadOptions)."""
        options = self.options
        if options.n_ubatch:
            return options.n_ubatch
        kv = cache_types.parse(options.cache_type_k), cache_types.parse(options.cache_type_v)
        return N_BATCH if cache_types.shape_free(*kv) else EXACT_F16_UBATCH

    def _build_drafters(self):
        """The speculative drafters, right after the context and before anything is
        decoded (the MTP assistant must be wired to a fresh target context)."""
        options = self.options
        self.drafter = None
        self.own_drafters = {}          # n-gram drafters made for requests' own setups (per_answer)
        self.own_policy = None          # the auto policy of requests asking for it on a fixed load
        self.spec_notes = []
        self._slot_drafters = [None] * len(self._views)
        if not options.spec.enabled:
            return
        if self._views:
            # One drafter per slot, each drafting for its slot's sequence (an n-gram
            # method's memory is its slot's; a draft model gets a context per slot).
            made = [build.build(dataclasses.replace(self.target, ctx=view), options.spec, self.n_rs_seq,
                                self.bundled_nextn) for view in self._views]
            self._slot_drafters = [d for d, _ in made]
            self.spec_notes = made[0][1]
            if any(d is None for d in self._slot_drafters):
                for d in self._slot_drafters:
                    if d is not None:
                        d.close()
                self._slot_drafters = [None] * len(self._views)
                return
            drafter = self._slot_drafters[0]
        else:
            self.drafter, self.spec_notes = build.build(self.target, options.spec, self.n_rs_seq,
                                                        self.bundled_nextn)
            drafter = self.drafter
        if drafter is not None and not cache_types.exact_on_threads(
                self.ctx.type_k, self.ctx.type_v, self.threads):
            self.spec_notes.append(
                f"note: a {options.cache_type_k}/{options.cache_type_v} KV cache on {self.threads} threads: "
                "one-row decodes split attention per thread once 512 tokens are cached, so speculative "
                "output is bitwise plain output only below that (use the default q8_0 cache, or --threads 1)")

    def _make_reader(self):
        """The F16 context prompts are read in (geniex.engine.prompt_reader), where the
        target allows one and ``prompt_kv`` asks for it; otherwise prompts decode on the
        target's cache and ``reader_note`` says why."""
        self.reader, self.reader_note = None, None
        if self.options.prompt_kv == "none":
            return
        drafters = [d for d in (self.drafter, *self._slot_drafters) if d is not None]
        why = prompt_reader.usable(self.model, self.ctx.type_k, self.ctx.type_v,
                                   any(d.reads_target_rows for d in drafters), self.options.nctx)
        probe = self.vocab.tokenize("The quick brown fox jumps over the lazy dog, twice.", add_special=True)[:16]
        if why is None and len(probe) < 2:
            why = "the vocabulary gave too few tokens to check the F16 cells against"
        if why is None:
            batcher = self.batcher
            reader = prompt_reader.PromptReader(self.model, self.ctx, self.threads_batch,
                                                batcher and batcher.call, batcher and batcher.aside)
            # The check's verdict is kept in the data dir beside the verify costs: a model
            # and cache it passed for load without it (and the F16 cache is made on the
            # first prompt read, so a load that reads none pays nothing for it).
            key = (f"reader|{policy.model_key(self.model.path)}{self.ctx.type_k}/{self.ctx.type_v}|"
                   f"{self.model._lib.path}|{prompt_reader.VERSION}")
            cache = policy.CalibrationCache(config.data_dir(self.options.data_dir) / "calibration.json")
            known = cache.get_record(key)
            try:
                if known and known.get("ok"):
                    reader.trust(self.model._lib, self.ctx, int(known["rot_k"]), int(known["rot_v"]))
                elif known:
                    raise kv_state.StateFormatError(str(known.get("why")))
                else:
                    reader.calibrate(self.ctx, probe)
                    cache.put_record(key, {"ok": True, "rot_k": reader.converter.rot_k,
                                           "rot_v": reader.converter.rot_v})
            except kv_state.StateFormatError as e:
                reader.close()
                why = str(e)
                if not known:
                    cache.put_record(key, {"ok": False, "why": why})
            else:
                self.reader = reader
                self.kv = self.history(self.ctx, 0)
        if why is not None:
            self.reader_note = why
            log.info("prompts decode on the target's %s/%s cache: %s", self.options.cache_type_k,
                     self.options.cache_type_v, why)

    def history(self, ctx, seq):
        """The KV history of sequence ``seq`` of the target (``ctx``, or a slot's view)."""
        if self.reader is None:
            return KvHistory(ctx)
        return prompt_reader.ReadHistory(ctx, self.reader, seq)

    def _thread_governor(self):
        """The governor that drops to one thread while a neighbour stalls decodes, or
        None. Moving between thread counts keeps every bit of the logits only with a
        cache type whose one-row decodes take the same path on any number of threads."""
        governed = (self.options.adaptive_threads and max(self.threads, self.threads_batch) > 1
                    and cache_types.exact_on_threads(self.ctx.type_k, self.ctx.type_v, 2))
        return ThreadGovernor(self.ctx, self.threads, self.threads_batch) if governed else None

    def _draft_policy(self, governor):
        """The draft policy: fixed, or calibrated on this model's verify costs. Called
        before the governor is attached (it would move threads mid-way). A batch row
        costs more on one thread than on every core, so where the governor may move the
        answer to one thread the policy gets that curve too and follows its setting."""
        if not self.speculative or self.options.spec.policy != "auto":
            return policy.FixedPolicy()
        costs, one_row = self._verify_cost(self.threads, self.threads_batch)
        others = {"one": self._verify_cost(1, 1)[0]} if governor else {}
        chosen = policy.GainPolicy(costs, one_row, others=others,
                                   setting=(lambda: governor.mode) if governor else None)
        self.spec_notes.append(chosen.describe())
        return chosen

    def _warm_up(self):
        # The first decode pays for graph allocation and weight repacking; do it at load
        # (as llama.cpp's tools do) so time-to-first-token measures the answer. The MTP
        # draft context already exists: it must be made before the target decodes.
        self._decode_one()

    def _decode_one(self):
        """One one-row decode at position 0, undone (warm-up and thread timing)."""
        tok = self.vocab.bos if self.vocab.bos >= 0 else 0
        self.ctx.decode(self.batch.fill([tok], 0))
        self.ctx.clear()

    def _verify_cost(self, threads, threads_batch):
        """The verify cost curve of this model on ``threads``/``threads_batch``: measured
        once, then read from the data dir's calibration cache."""
        key = (f"{policy.model_key(self.model.path)}{threads}/{threads_batch}|"
               f"{self.options.cache_type_k}/{self.options.cache_type_v}|{policy.CALIBRATION}")
        cache = policy.CalibrationCache(config.data_dir(self.options.data_dir) / "calibration.json")
        found = cache.get(key)
        if found is None:
            tok = self.vocab.bos if self.vocab.bos >= 0 else 0
            self.ctx.set_threads(threads, threads_batch)
            try:
                found = policy.calibrate(self.ctx, self.batch, tok)
            finally:
                self.ctx.set_threads(self.threads, self.threads_batch)
            cache.put(key, found, stalled=policy.stalled(found[0]))   # stalled: measured again next load
        return found

    def reset(self, drafts=False):
        """Forget the conversation: the next prompt is decoded from scratch. With
        ``drafts``, the drafters also forget what they learned from earlier answers
        (the n-gram methods' memory, which otherwise lasts as long as the session)."""
        if self.slots is not None:
            self.slots.forget(drafts)
            return
        self.kv.reset()
        if drafts:
            for d in (self.drafter, *self.own_drafters.values()):
                if d is not None:
                    d.forget()

    def seat(self, tokens, owner=None, reuse=None, what=""):
        """A context manager giving the session one answer to ``tokens`` runs on: the
        session itself, or with slots (``LoadOptions.parallel``) a slot's
        :class:`~geniex.engine.slots.SlotSession`, taken for the answer (waiting for a
        free one) and given back after."""
        if self.slots is None:
            return contextlib.nullcontext(self)
        return self.slots.seat(tokens, owner, reuse, what)

    def adopt(self, tokens, owner=None, reuse=None):
        """Make the KV cache ready for a prompt of ``tokens`` asked by ``owner``: keep its
        cached prefix when the owner's conversation is there (``reuse`` True, or None
        where the cache type makes that exact), or put back the owner's saved
        conversation sharing a longer prefix (:mod:`geniex.engine.prompt_cache`), else
        start clean. A conversation the prompt would cut short is saved for its owner."""
        reuse = self.reuse_exact if reuse is None else reuse
        same = owner == self.kv_owner
        held = common_prefix(self.kv.tokens, tokens) if same and reuse else 0
        with self.prompt_cache.lock:            # slots adopt from their own threads
            key, shared = self.prompt_cache.best(tokens, owner) if reuse else (None, 0)
            if len(self.kv.tokens) - held >= MIN_TOKENS or (key is not None and shared > held):
                self.prompt_cache.save(self.kv, self.kv_owner)
            if key is not None and shared > held:
                if not self.prompt_cache.restore(self.kv, key):
                    self.kv.reset()
            elif not (same and reuse):
                self.kv.reset()
        self.kv_owner = owner

    # -- answering ---------------------------------------------------------------
    def tokenize_prompt(self, text):
        """A complete prompt (already templated) -> tokens, with BOS where the model
        wants one and the template did not already put it. GenieXError if nothing is
        left to answer (a model's template that renders nothing, without a BOS)."""
        tokens = self.vocab.tokenize(text, add_special=self.vocab.add_bos, parse_special=True)
        if len(tokens) >= 2 and tokens[0] == tokens[1] == self.vocab.bos:
            tokens = tokens[1:]
        if not tokens:
            raise GenieXError("the prompt is empty: the model's chat template rendered nothing for this "
                              "conversation")
        return tokens

    def generate(self, prompt_tokens, opts, cancel=None, speculative=True, progress=None, spec=None):
        """Start answering; returns a :class:`Generation` to iterate. ``progress(total,
        cached, processed)`` hears how far the prompt's decoding got. ``spec``: the
        request's own speculative setup, answered on the drafters as loaded
        (geniex.speculative.per_answer); None: the loaded setup."""
        if spec is not None and spec.key() == self.options.spec.key():
            spec = None
        drafter = self._drafter_for(spec) if speculative else NO_DRAFTER
        answer_policy = None
        if spec is not None and drafter is not NO_DRAFTER:
            answer_policy = self._policy_for(spec.policy)
        if opts.prediction:
            drafter = self._with_prediction(drafter, opts.prediction)
        if opts.grammar is not None or opts.think_budget is not None:
            # Forced-token drafts ride on speculation: off for a plain answer, and as long
            # as a recurrent target can roll back (none without speculation).
            forced = speculative and (not self.model.recurrent or self.n_rs_seq > 0)
            opts = dataclasses.replace(opts, forced_drafts=opts.forced_drafts and forced,
                                       forced_max=self.n_rs_seq if self.model.recurrent else None)
        return Generation(self, prompt_tokens, opts, drafter, cancel, progress, answer_policy,
                          (spec or self.options.spec).types)

    def _drafter_for(self, spec):
        """An answer's drafter: the loaded one with its loaded settings (``spec`` None),
        else the one ``spec`` asks for on it (geniex.speculative.per_answer)."""
        if spec is None:
            per_answer.restore(self.drafter)     # an earlier answer may have set its own
            return self.drafter or NO_DRAFTER
        return per_answer.drafter(self.drafter, spec, self.n_rs_seq if self.model.recurrent else None,
                                  self.own_drafters)

    def _policy_for(self, wanted):
        """The draft policy of an answer whose request asks for ``wanted`` ("auto", "fixed").
        A session loaded with a fixed policy (or none) keeps it for the answers that ask
        for nothing: "auto" gets an auto policy of its own, made on first use."""
        if wanted == "fixed":
            return loop.FIXED
        if not isinstance(self.policy, policy.FixedPolicy):
            return self.policy
        if self.own_policy is None:
            self.own_policy = self._gain_policy()
        return self.own_policy

    def _with_prediction(self, drafter, text):
        """``drafter`` preceded by drafts from the request's predicted output (OpenAI's
        ``prediction``): asked for by the request, so it drafts even where the session
        has no drafter of its own, but only where drafting keeps the answer exact."""
        if self.model.recurrent and self.n_rs_seq == 0:
            raise UsageError("prediction: this model keeps recurrent state that can be rolled back only when it is "
                             "loaded with a speculative method (spec_type): a predicted output cannot be checked "
                             "without one", param="prediction")
        if not cache_types.exact_on_threads(self.ctx.type_k, self.ctx.type_v, self.threads):
            raise UsageError(f"prediction: drafting on a {self.options.cache_type_k}/{self.options.cache_type_v} KV "
                             f"cache on {self.threads} threads could change the answer past 512 tokens; load it "
                             "with the default q8_0 cache types", param="prediction")
        self._prediction_policy()
        tokens = self.vocab.tokenize(text, add_special=False, parse_special=False)
        own = PredictionDrafter(tokens)
        return own if drafter is NO_DRAFTER else DrafterChain([own, drafter])

    def _prediction_policy(self):
        """A session without drafters drafts by a fixed policy (it never drafts); a
        prediction gets the draft policy an auto session has, on this model's verify
        cost curve, made on first use: a whole 16-token draft verified every step costs
        more than it saves where the prediction and the answer part."""
        if not isinstance(self.policy, policy.FixedPolicy) or self.options.spec.policy != "auto":
            return
        self.policy = self._gain_policy()

    def _gain_policy(self):
        """An auto draft policy on this model's verify cost curve, measured now."""
        governor, self.ctx.governor = self.ctx.governor, None     # calibrating sets threads itself
        # Measuring decodes on (and empties) the context, which may hold a conversation
        # the next prompt reuses: keep its state aside and put it back.
        state = self.ctx.save_state() if self.kv.tokens else None
        try:
            costs, one_row = self._verify_cost(self.threads, self.threads_batch)
        finally:
            self.ctx.governor = governor
            if state is not None and not self.ctx.load_state(state):
                self.kv.reset()
        return policy.GainPolicy(costs, one_row)

    def compute(self, fn, *args):
        """``fn(*args)`` where this session's library work runs: with slots, on their
        decode thread (geniex.engine.batcher); else here, one caller at a time."""
        if self.batcher is not None:
            return self.batcher.call(fn, *args)
        with self.embd_lock:
            return fn(*args)

    def embeddings_context(self):
        """A context on the same weights that outputs pooled embeddings (the model's own
        pooling), made on first use: one batch of :data:`N_BATCH` rows holds an input."""
        if self._embd is None:
            self._embd = Context(self.model, n_ctx=N_BATCH, n_batch=N_BATCH, n_ubatch=N_BATCH,
                                 n_threads=self.threads, n_threads_batch=self.threads_batch,
                                 type_k=self.options.cache_type_k, type_v=self.options.cache_type_v,
                                 embeddings=True)
        return self._embd

    def run(self, task, cancel=None):
        """Run a server task (:mod:`geniex.engine.tasks`) on this session: its events."""
        from geniex.engine import tasks     # tasks builds on chat, which builds on sessions
        return tasks.run(self, task, cancel)

    @property
    def n_ctx(self):
        """The context one conversation has (each slot's, with slots)."""
        return self.options.nctx if self.slots is not None else self.ctx.n_ctx

    @property
    def speculative(self):
        return self.drafter is not None or any(d is not None for d in getattr(self, "_slot_drafters", ()))

    def close(self):
        """Free drafters, context and model (in that order: the MTP draft reads the target)."""
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        if getattr(self, "slots", None) is not None:
            self.slots.close()
            self.slots = None
        else:
            for d in getattr(self, "_slot_drafters", ()):
                if d is not None:
                    d.close()
        self._slot_drafters = []
        if getattr(self, "_embd", None) is not None:
            self._embd.close()
            self._embd = None
        if getattr(self, "reader", None) is not None:
            self.reader.close()
            self.reader = None
        if getattr(self, "ctx", None) is not None:
            self.ctx.close()
        if getattr(self, "model", None) is not None:
            self.model.close()


def open_session(model, options, submit=None):
    """Open a Session on a store-resolved model (a ResolvedModel): the one way every
    caller opens a model (``geniex infer``, the server's worker, :func:`geniex.api.load`).

    Applies GenieX's rules for runtimes and multimodal models, and checks the context
    size against the model's trained context and the memory budget before the library
    allocates anything (:func:`geniex.engine.limits.checked`: a default beyond the
    trained context is cut down to it; a KV cache over ``options.memory_budget`` is a
    UsageError)."""
    if model.runtime != "llama_cpp":
        if options.spec.enabled:
            log.warning("speculative decoding is only supported by llama_cpp")
        raise GenieXError(f"{model.name} uses the {model.runtime} runtime (a QAIRT bundle for "
                          "Qualcomm's own runner), which geniex cannot run; use a GGUF model")
    if model.type == "vlm" and options.spec.enabled:
        log.warning("%s is multimodal: speculative decoding runs the text path, and image/audio "
                    "content is dropped", model.name)
    options = limits.checked(model, options, budget=options.memory_budget)
    return Session(model.path, options, name=model.name, submit=submit)


# Architectures with a NextN draft graph (``graph_mtp``) in the b11549 library; only
# qwen35 is exercised by tests (tests/support/tiny_nextn.py).
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


class Generation:
    """One answer in progress: iterate for :class:`~geniex.engine.loop.Step` records."""

    def __init__(self, session, prompt_tokens, opts, drafter, cancel, progress=None, policy=None, spec_types=None):
        self.session = session
        if spec_types is None:
            spec_types = session.options.spec.types
        self.stats = Stats(spec_types=tuple(spec_types) if drafter is not NO_DRAFTER else ())
        self.tokens = []
        self._parts = []
        if drafter is NO_DRAFTER:
            policy = loop.FIXED
        self._steps = loop.steps(session.ctx, session.vocab, session.kv, session.batch, prompt_tokens,
                                 opts, drafter, cancel, self.stats, policy or session.policy, progress)

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
