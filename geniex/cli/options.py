"""Flags shared by ``infer`` and ``run`` (and their translation into engine options).

The engine is imported where options are built, not here: every verb's parser is built
on each start of the CLI, and ``geniex list`` need not load numpy and Jinja.

``run`` forwards the same values to the server as request fields, so both verbs accept
exactly the same flags with the same defaults.
"""
import argparse

from geniex.errors import UsageError
from geniex.llama.cache_types import TYPES as CACHE_TYPES
from geniex.speculative import options as spec_options_table


def _number(kind, name, minimum):
    """An argparse type: ``kind`` (int or float) of at least ``minimum``, with a message
    naming the flag."""
    def parse(value):
        try:
            n = kind(value)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{name} takes {what}, not {value!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be at least {minimum} (got {value})")
        return n
    return parse


def _positive(name):
    return _number(int, name, 1)


def _nonneg(kind, name):
    return _number(kind, name, 0)


def _cache_type(name):
    def parse(value):
        if value.lower() not in CACHE_TYPES:
            raise argparse.ArgumentTypeError(f"{name} {value!r}: expected one of {', '.join(CACHE_TYPES)}")
        return value.lower()
    return parse


def add_chat_verb(sub, name, func, *, help, description, spec_trace):
    """The parser of a verb that answers prompts (``infer``, ``run``): MODEL, ``-p``,
    ``-i``, ``--spec-trace`` (``spec_trace`` is its help) and the model flags; returns
    it for the verb's own flags."""
    p = sub.add_parser(name, help=help, description=description)
    add_chat_flags(p)
    p.add_argument("--spec-trace", metavar="FILE", help=spec_trace)
    add_model_flags(p)
    p.set_defaults(func=func)
    return p


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
                   help="cpu, gpu, npu, or devices like HTP0,HTP1 (default: npu if the library has one, else gpu, else cpu)")
    g.add_argument("-n", "--ngl", type=int, default=-1, help="layers to offload, -1 = all (default -1)")
    g.add_argument("--nctx", type=_positive("--nctx"), default=4096, help="context length in tokens (default 4096)")
    g.add_argument("--threads", type=_nonneg(int, "--threads"), default=0,
                   help="threads for decoding (default 0 = every physical core)")
    g.add_argument("-ctk", "--cache-type-k", type=_cache_type("--cache-type-k"), default="q8_0",
                   help="KV cache type for K: " + ", ".join(CACHE_TYPES) + " (default q8_0: keeps "
                        "speculative output bitwise identical on every core; see docs/speculative.md)")
    g.add_argument("-ctv", "--cache-type-v", type=_cache_type("--cache-type-v"), default="q8_0",
                   help="KV cache type for V (default q8_0)")
    g.add_argument("--prompt-kv", choices=("f16", "none"), default="f16",
                   help="read the prompt in an F16 KV cache of its own, whose cells then move to the quantized "
                        "cache the answer decodes on: 1.7x faster prompts on CPU for F16 KV memory on top, the "
                        "answer unchanged (default f16; none: decode the prompt on the answer's cache)")
    g.add_argument("--chat-template", metavar="NAME|FILE", default=None,
                   help="chat template in place of the model's own: one of llama.cpp's built-in formats "
                        "(chatml, llama3, gemma, mistral-v7, ...) or a Jinja template file (default: the "
                        "model's; a model without one gets its architecture's built-in format, else chatml)")
    s = p.add_argument_group("answer")
    s.add_argument("--max-tokens", type=_positive("--max-tokens"), default=2048, help="answer length limit (default 2048)")
    s.add_argument("--stop", action="append", default=[], help="stop string (repeatable); not printed")
    s.add_argument("--stop-file", metavar="PATH", action="append", default=[],
                   help="stop strings from a file, one per line (repeatable; added to --stop)")
    s.add_argument("--think", action=argparse.BooleanOptionalAction, default=None,
                   help="thinking on (--think) or off (--no-think) for templates that read enable_thinking "
                        "(default: the template's own)")
    s.add_argument("--reasoning-budget", type=_budget, default=-1, metavar="N",
                   help="thought tokens an answer may spend in its reasoning block before the block is closed "
                        "for it (-1 = no limit, default; 0 = at once); not with a grammar or JSON schema")
    s.add_argument("-s", "--system-prompt", default=None)
    s.add_argument("--temperature", type=_nonneg(float, "--temperature"), default=0.0, help="0 = greedy (default)")
    s.add_argument("--top-p", type=_nonneg(float, "--top-p"), default=0.0, help="0 = unset")
    s.add_argument("--top-k", type=_nonneg(int, "--top-k"), default=0, help="0 = unset")
    s.add_argument("--min-p", type=_nonneg(float, "--min-p"), default=0.0, help="0 = unset")
    s.add_argument("--repetition-penalty", type=_nonneg(float, "--repetition-penalty"), default=1.0)
    s.add_argument("--presence-penalty", type=float, default=0.0)
    s.add_argument("--frequency-penalty", type=float, default=0.0)
    s.add_argument("--seed", type=_nonneg(int, "--seed"), default=0, help="0 = random")
    c = s.add_mutually_exclusive_group()
    c.add_argument("--grammar-string", metavar="GBNF", default=None,
                   help="constrain the answer to a GBNF grammar (docs/structured-output.md)")
    c.add_argument("--grammar-path", metavar="FILE", default=None, help="constrain the answer to the GBNF grammar in FILE")
    c.add_argument("--json-schema", metavar="SCHEMA", default=None,
                   help="constrain the answer to a JSON schema: the schema itself, or @FILE; {} = any JSON object")
    spec_options_table.add_flags(p.add_argument_group("speculative decoding"))
    return p


def sampling_params(args):
    """SamplingParams from parsed flags."""
    from geniex.engine.sampling import SamplingParams
    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, seed=args.seed)


def load_options(args, draft_path=None):
    """LoadOptions (with the speculative settings) from parsed flags."""
    from geniex.engine import session
    from geniex.engine.chat import template_choice
    values = {**vars(args), "chat_template": template_choice(getattr(args, "chat_template", None))}
    return session.load_options(values, data_dir=getattr(args, "data_dir", None),
                                spec=spec_options_table.from_args(args, draft_path))


def _budget(value):
    try:
        n = int(value)
    except ValueError:
        n = -2
    if n < -1:
        raise argparse.ArgumentTypeError(f"expected -1 (no limit) or a number of tokens >= 0, got {value!r}")
    return n


def gen_options(args):
    """GenOptions (length, stop strings, sampling, grammar) from parsed flags."""
    from geniex.engine.loop import GenOptions
    if any(not s for s in args.stop):
        raise UsageError("--stop needs a non-empty string")
    stops = list(args.stop)
    for path in getattr(args, "stop_file", None) or ():
        stops += read_stop_file(path)
    constraint = grammar(args)
    if constraint is not None and getattr(args, "reasoning_budget", -1) >= 0:
        raise UsageError(f"--reasoning-budget cannot be combined with {grammar_source(args)[2]}: the answer would "
                         "be constrained twice")
    return GenOptions(max_tokens=args.max_tokens, stop=tuple(stops), sampling=sampling_params(args),
                      grammar=constraint)


def read_stop_file(path):
    """``--stop-file``: one stop string per line (a trailing newline is not part of
    it; empty lines are skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"--stop-file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--stop-file {path}: not UTF-8 text") from None
    stops = [line for line in lines if line]
    if not stops:
        raise UsageError(f"--stop-file {path}: no stop strings in it (one per line)")
    return stops


def template_kwargs(args):
    """The chat template variables the flags set (``--think``: ``enable_thinking``)."""
    think = getattr(args, "think", None)
    return None if think is None else {"enable_thinking": think}


def grammar_source(args):
    """``(kind, text, flag)`` of the constraint the flags ask for, or None: the text of
    ``--grammar-path`` and of ``--json-schema @FILE`` read here (UsageError if unreadable)."""
    if getattr(args, "grammar_string", None) is not None:
        return "gbnf", args.grammar_string, "--grammar-string"
    if getattr(args, "grammar_path", None) is not None:
        return "gbnf", _read(args.grammar_path, "--grammar-path"), "--grammar-path"
    schema = getattr(args, "json_schema", None)
    if schema is not None:
        if schema.startswith("@"):
            schema = _read(schema[1:], "--json-schema")
        return "json_schema", schema, "--json-schema"
    return None


def grammar(args):
    """The compiled Grammar the flags ask for, or None (GrammarError naming the flag)."""
    from geniex.engine.constraints import Grammar
    source = grammar_source(args)
    return Grammar.parse(*source[:2], param=source[2]) if source else None


def _read(path, flag):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{flag} {path}: {getattr(e, 'strerror', None) or e}") from None
