"""The configurations a bench run compares: each side at its own defaults, and at equal settings.

- ours: ``geniex``'s Session as ``geniex infer`` builds it (every physical core, micro-batch
  512 with its q8_0 KV cache, draft policy auto, n-gram memory kept across answers);
- native: llama.cpp's own server (``xllamacpp.Server``, the same b11549 library) as
  ``llama-server`` starts: its own threads, micro-batch 512, F16 KV cache, ngram-mod at
  its own parameters (24/48/64), its ngram-mod table kept across requests.

``=`` configurations run native at ours' settings (threads, micro-batch, KV cache, and for
drafting ours' n-gram parameters): the two loops compared on the same arithmetic, which
gives the same text. ``fresh`` configurations forget what drafting learned before every
request (ours only: a user's first request).
"""
from dataclasses import asdict, dataclass

NCTX = 4096
NATIVE_NGRAM_MOD = (24, 48, 64)      # llama.cpp's server defaults: match, min and max draft


@dataclass
class Config:
    """One side, one method, one group of settings; runs in its own worker process."""

    name: str
    side: str                       # "ours" | "native"
    spec: str = ""                  # "" (plain) or a --spec-type method
    settings: str = "defaults"      # "defaults" (each side's own) | "equal" (native at ours')
    threads: int = 0                # 0 = the side's default
    threads_batch: int = 0
    ubatch: int = 0                 # 0 = the side's default (512 on both sides)
    cache: str = ""                 # "" = the side's default (ours q8_0, native f16)
    ngram: tuple = ()               # (n, min, max); () = the side's defaults
    policy: str = "auto"            # ours: --draft-policy
    fresh: bool = False             # ours: forget the n-gram memory before every request
    detail: bool = False            # ours: return every step's draft, for the counts

    @property
    def plain(self):
        return not self.spec

    def to_json(self):
        return asdict(self)

    @classmethod
    def from_json(cls, body):
        cfg = cls(**body)
        cfg.ngram = tuple(cfg.ngram)
        return cfg


def parse_method(text):
    """``ngram-mod`` or ``ngram-mod:4/2/16`` (match length, shortest and longest draft) ->
    ``(method, (n, min, max))``; zeros: the method's defaults."""
    method, _, params = text.partition(":")
    nums = tuple(int(x) for x in params.split("/")) if params else (0, 0, 0)
    if len(nums) != 3:
        raise ValueError(f"{text}: give n-gram parameters as n/min/max")
    return method, nums


def make(quick=False, methods=("ngram-mod",), fresh=True, equal=True, native=True, one_thread=False):
    """The configurations of a run (see the module docstring). ``methods`` are ours'
    drafting methods (``method[:n/min/max]``); ngram-mod at its defaults is compared with
    native's (the issue's target). ``one_thread`` adds ours plain on one thread, what
    ours at its defaults must keep up with beside a busy neighbour (``bench.py --load``)."""
    from geniex.config import physical_cores
    from geniex.speculative.options import NGRAM_DEFAULTS
    cores = physical_cores()
    cfgs = [Config("ours plain", "ours")]
    if one_thread:
        cfgs.append(Config("ours plain 1 thread", "ours", threads=1, threads_batch=1))
    for label in methods:
        m, params = parse_method(label)
        cfgs.append(Config(f"ours {label}", "ours", m, ngram=params if any(params) else (), detail=True))
        if fresh and not quick and label == "ngram-mod":
            cfgs.append(Config(f"ours {m} fresh", "ours", m, fresh=True))
    if not native:
        return cfgs
    cfgs.append(Config("native plain", "native"))
    if "ngram-mod" in methods:
        cfgs.append(Config("native ngram-mod", "native", "ngram-mod", ngram=NATIVE_NGRAM_MOD))
    if equal and not quick:
        same = dict(settings="equal", threads=cores, threads_batch=cores, ubatch=512, cache="q8_0")
        cfgs.append(Config("native plain =", "native", **same))
        if "ngram-mod" in methods:
            cfgs.append(Config("native ngram-mod =", "native", "ngram-mod", ngram=NGRAM_DEFAULTS["ngram-mod"], **same))
    return cfgs
