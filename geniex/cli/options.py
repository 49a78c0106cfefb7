"""Flags shared by ``infer`` and ``run`` (and their translation into engine options).

``run`` forwards the same values to the server as request fields, so both verbs accept
exactly the same flags with the same defaults.
"""
import argparse

from geniex.engine.loop import GenOptions
from geniex.engine.runtime import LoadOptions, SpecOptions
from geniex.engine.sampling import SamplingParams
from geniex.errors import UsageError

SPEC_TYPES = ("draft-mtp", "draft-simple", "draft-eagle3", "ngram-mod", "ngram-simple",
              "ngram-map-k", "ngram-map-k4v", "ngram-cache")


def _positive(name):
    def parse(value):
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes a whole number, not {value!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1 (got {n})")
        return n
    return parse


def _nonneg(kind, name):
    def parse(value):
        try:
            n = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes a number, not {value!r}") from None
        if n < 0:
            raise argparse.ArgumentTypeError(f"{name} must not be negative (got {value})")
        return n
    return parse


def add_chat_flags(p):
    """MODEL, ``-p`` and ``-i``: what to talk to and what to say (infer and run)."""
    p.add_argument("model", nargs="?", default=None,
                   help="store name org/repo[:precision] or a GGUF path (default: the bundled demo model)")
    p.add_argument("-p", "--prompt", action="append", default=[], help="a one-shot turn (repeatable)")
    p.add_argument("-i", "--input", metavar="FILE", help="read a prompt from FILE ('-' = stdin); "
                                                         "with -p it is appended to the first prompt")
    return p


def add_model_flags(p):
    """Load, sampling and speculative flags (GenieX names and defaults)."""
    g = p.add_argument_group("model and device")
    g.add_argument("-c", "--compute", default=None,
                   help="cpu, gpu, npu, hybrid, or devices like HTP0,HTP1 (default: npu if the library has one, else gpu, else cpu)")
    g.add_argument("-n", "--ngl", type=int, default=-1, help="layers to offload, -1 = all (default -1)")
    g.add_argument("--nctx", type=_positive("--nctx"), default=4096, help="context length in tokens (default 4096)")
    g.add_argument("--threads", type=_nonneg(int, "--threads"), default=0,
                   help="threads for one-token decodes (default 1: keeps speculative output bitwise identical; see README)")
    s = p.add_argument_group("answer")
    s.add_argument("--max-tokens", type=_positive("--max-tokens"), default=2048, help="answer length limit (default 2048)")
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable); not printed")
    s.add_argument("-s", "--system-prompt", default=None)
    s.add_argument("--temperature", type=_nonneg(float, "--temperature"), default=0.0, help="0 = greedy (default)")
    s.add_argument("--top-p", type=_nonneg(float, "--top-p"), default=0.0, help="0 = unset")
    s.add_argument("--top-k", type=_nonneg(int, "--top-k"), default=0, help="0 = unset")
    s.add_argument("--min-p", type=_nonneg(float, "--min-p"), default=0.0, help="0 = unset")
    s.add_argument("--repetition-penalty", type=_nonneg(float, "--repetition-penalty"), default=1.0)
    s.add_argument("--presence-penalty", type=float, default=0.0)
    s.add_argument("--frequency-penalty", type=float, default=0.0)
    s.add_argument("--seed", type=_nonneg(int, "--seed"), default=0, help="0 = random")
    d = p.add_argument_group("speculative decoding")
    d.add_argument("--spec-type", default="", help="comma list of: " + ", ".join(SPEC_TYPES) + " (default off)")
    d.add_argument("--draft-model", default="", help="draft model: store name org/repo[:precision] or a GGUF path")
    d.add_argument("--draft-tokens", type=_positive("--draft-tokens"), default=3, help="max draft tokens per step (default 3)")
    d.add_argument("--draft-min", type=_nonneg(int, "--draft-min"), default=0, help="drop shorter drafts (0 = default, 0)")
    d.add_argument("--draft-p-min", type=_nonneg(float, "--draft-p-min"), default=0.0,
                   help="stop drafting below this probability (0 = default, 0)")
    d.add_argument("--ngram-n", type=_nonneg(int, "--ngram-n"), default=0, help="n-gram match length (0 = method default)")
    d.add_argument("--ngram-min", type=_nonneg(int, "--ngram-min"), default=0, help="n-gram minimum draft (0 = method default)")
    d.add_argument("--ngram-max", type=_nonneg(int, "--ngram-max"), default=0, help="n-gram maximum draft (0 = method default, 8); --draft-tokens limits model drafters")
    return p


def spec_types(value):
    """``--spec-type`` comma list -> tuple of names (unknown names are kept: setup
    refuses them with a reason and falls back, as GenieX does)."""
    return tuple(t.strip().lower() for t in (value or "").split(",") if t.strip())


def sampling_params(args):
    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, seed=args.seed)


def spec_options(args, draft_path=None):
    return SpecOptions(
        types=spec_types(args.spec_type), draft_model=args.draft_model, draft_path=draft_path,
        n_max=args.draft_tokens, n_min=args.draft_min, p_min=args.draft_p_min,
        ngram_n=args.ngram_n, ngram_min=args.ngram_min, ngram_max=args.ngram_max)


def load_options(args, draft_path=None):
    return LoadOptions(nctx=args.nctx, ngl=args.ngl, compute=args.compute, threads=args.threads,
                       spec=spec_options(args, draft_path))


def gen_options(args):
    if any(not s for s in args.stop):
        raise UsageError("--stop needs a non-empty string")
    return GenOptions(max_tokens=args.max_tokens, stop=tuple(args.stop), sampling=sampling_params(args))
