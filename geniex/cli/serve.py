"""`geniex serve`: the OpenAI-compatible local server (docs/server.md)."""
import os

from geniex.errors import UsageError
from geniex.llama.cache_types import TYPES as CACHE_TYPES
from geniex.server import DEFAULT_HOST
from geniex.speculative import options as spec_options


def register(sub):
    """Add the verb's parser."""
    p = sub.add_parser("serve", help="run the OpenAI-compatible local server",
                       description="Serve stored models over an OpenAI-compatible HTTP API. Speculative "
                                   "decoding is chosen per request (spec_* fields; the --spec-* flags set it for "
                                   "requests that set none); the server never downloads.")
    p.add_argument("--host", default=None,
                   help=f"HOST:PORT to listen on (env GENIEX_HOST, default {DEFAULT_HOST}; port 0 = any free port); "
                        "several, comma separated: 127.0.0.1:8080,[::1]:8080, or 127.0.0.1,::1 with --port")
    p.add_argument("--port", type=int, default=None, help="the port for addresses of --host that name none")
    p.add_argument("-m", "--model", default=None,
                   help="default model: answers requests that name no model or one not in the store (as "
                        "llama.cpp's server answers with its loaded model), with a warning in the answer; "
                        "default: the resident model, once one is loaded")
    p.add_argument("--n-predict", type=int, default=None,
                   help="answer length for requests that set none (-1 = until the context is full; default: "
                        "2048 for chat and /completion, 16 for /v1/completions)")
    p.add_argument("--reasoning", choices=("on", "off", "auto"), default="auto",
                   help="thinking of chat answers when a request sets none: on or off (the templates' "
                        "enable_thinking), auto (default: the template's own, thinking where it thinks)")
    p.add_argument("--reasoning-format", default="auto", choices=("none", "deepseek", "deepseek-legacy", "auto"),
                   help="default reasoning_format of chat answers: where <think> thoughts go (default auto: "
                        "reasoning_content, as llama.cpp's server)")
    p.add_argument("--reasoning-budget", type=int, default=-1,
                   help="thought tokens a chat answer may spend in its reasoning block before the block is "
                        "closed for it (-1 = no limit, 0 = close at once; default -1); a request's "
                        "thinking_budget_tokens overrides it")
    p.add_argument("--reasoning-budget-message", default="",
                   help="text put before the closing marker when the reasoning budget runs out (default none)")
    p.add_argument("--metrics", action="store_true", help="serve GET /metrics (Prometheus text; default off)")
    p.add_argument("--no-slots", dest="slots", action="store_false", help="answer GET /slots with 501")
    p.add_argument("--keepalive", type=float, default=None,
                   help="seconds an idle model stays loaded (env GENIEX_KEEPALIVE, default 300; "
                        "0 = free after each request, negative = never)")
    p.add_argument("--nctx", type=int, default=4096, help="default context length (default 4096)")
    p.add_argument("-n", "--ngl", type=int, default=-1, help="default layers to offload, -1 = all (default -1)")
    p.add_argument("-c", "--compute", default=None,
                   help="default compute: cpu, gpu, npu or devices like HTP0,HTP1 (default: best available)")
    p.add_argument("-ctk", "--cache-type-k", default="q8_0", help="default KV cache type for K (default q8_0)")
    p.add_argument("-ctv", "--cache-type-v", default="q8_0", help="default KV cache type for V (default q8_0)")
    p.add_argument("--prompt-kv", choices=("f16", "none"), default="f16",
                   help="read prompts in an F16 KV cache of their own, whose cells then move to the quantized "
                        "cache answers decode on: 1.7x faster prompts on CPU for F16 KV memory on top, answers "
                        "unchanged (default f16; none: prompts decode on the answer's cache; docs/speculative.md)")
    p.add_argument("-s", "--seed", type=int, default=-1, metavar="N",
                   help="the seed of sampled answers whose request sets none, so that they repeat "
                        "(default -1: a random seed per answer, as llama-server)")
    p.add_argument("-a", "--alias", metavar="NAMES", default=None,
                   help="more names of --model, comma separated: requests may name it by any, and /v1/models "
                        "lists it by the first in sort order (as llama-server)")
    p.add_argument("--tags", metavar="TAGS", default=None,
                   help="comma separated tags of --model, shown in /v1/models")
    p.add_argument("--no-webui", "--no-ui", dest="webui", action="store_false",
                   help="do not serve the Swagger UI at / and /docs/ (the API and /openapi.json stay; "
                        "--no-ui is llama-server's spelling)")
    p.add_argument("--chat-template", metavar="NAME|FILE", default=None,
                   help="chat template in place of the models' own: one of llama.cpp's built-in formats (chatml, "
                        "llama3, gemma, mistral-v7, ...) or a Jinja template file (default: each model's; a model "
                        "without one gets its architecture's built-in format, else chatml)")
    p.add_argument("--chat-template-file", metavar="FILE", default=None,
                   help="a Jinja chat template file (llama-server's spelling of --chat-template FILE)")
    p.add_argument("--cache-ram", type=int, default=8192, metavar="MiB",
                   help="host memory for conversations that left the context, so a client that comes back "
                        "(an agent after another spoke) pays only for its new tokens; least recently used "
                        "out (default 8192, as llama-server; 0 = keep none)")
    p.add_argument("-np", "--parallel", type=int, default=4, metavar="N",
                   help="answers a model runs at once (slots): each has its own conversation and a KV cache of "
                        "--nctx tokens (so N times the memory of one), and their tokens share each decode "
                        "(default 4, as llama-server's auto; 1 = one at a time)")
    p.add_argument("--fixed-load", action="store_true",
                   help="fix the load settings (--nctx, --ngl, --compute, cache types and the speculative "
                        "flags) as llama-server's are: a request asking for others is a 400 naming the field, "
                        "so no client makes the model reload for everyone (default: requests may change them)")
    spec_options.add_flags(p.add_argument_group(
        "speculative decoding of requests that set no spec_* field (docs/speculative.md)"))
    sec = p.add_argument_group("security and limits (docs/server.md, Security)")
    sec.add_argument("--origins", default="",
                     help="web page origins allowed to call the server (CORS), comma separated: an origin "
                          "(http://localhost:3000), a host name (any scheme and port), localhost (any "
                          "loopback origin), * = any (default: none)")
    sec.add_argument("--allowed-hosts", default="",
                     help="Host header names accepted besides loopback names and the bound address, comma "
                          "separated (defeats DNS rebinding); * = any (default: none)")
    sec.add_argument("--api-key", default=None,
                     help="require `Authorization: Bearer KEY` on /v1 requests; several keys comma separated, "
                          "and one key's cached prompt never answers another's (env GENIEX_API_KEY; default: none)")
    sec.add_argument("--allow-paths", action="store_true",
                     help="let requests load GGUF files by path (default: stored models only)")
    sec.add_argument("--https", action="store_true",
                     help="serve HTTPS (TLS) with --certfile and --keyfile instead of plain HTTP")
    sec.add_argument("--certfile", metavar="PATH", help="the server's certificate chain (PEM), with --https")
    sec.add_argument("--keyfile", metavar="PATH", help="the certificate's private key (PEM), with --https")
    sec.add_argument("--grammar-dir", metavar="DIR", default=None,
                     help="the folder whose GBNF files requests may name in grammar_path (default: none; "
                          "grammar_path is then refused)")
    sec.add_argument("--max-body", default="8M",
                     help="largest request body, e.g. 512K, 8M (default 8M; larger gets 413)")
    sec.add_argument("--max-queue", type=int, default=8,
                     help="requests that may wait for the model (default 8; more get 503 with Retry-After)")
    sec.add_argument("--request-timeout", type=float, default=None,
                     help="seconds a request may hold the model; an answer over it ends with finish_reason "
                          "length (504 if nothing was produced yet). Default: fits the longest answer the "
                          "model's context allows, measured at load (at least 60 s); 0 = no limit "
                          "(docs/isolation.md)")
    sec.add_argument("--load-timeout", type=float, default=None,
                     help="seconds a model load may take before its worker is stopped and the request gets a "
                          "504; default: 60 s plus 40 s per GB of model files (a slow disk's pace, so only a "
                          "load that hangs runs out); 0 = no limit (docs/isolation.md)")
    sec.add_argument("--memory-budget", default=None,
                     help="KV cache memory a context may take, e.g. 2G (env GENIEX_MEMORY_BUDGET; default "
                          "half the machine's memory); larger nctx gets 400")
    p.set_defaults(func=run)


def ggml_name(value):
    """A cache type name as the flag gave it, checked."""
    if value.lower() not in CACHE_TYPES:
        raise UsageError(f"unknown KV cache type {value!r} (known: {', '.join(CACHE_TYPES)})")
    return value.lower()


def _seed(value):
    """``--seed``: -1 (or llama.cpp's 0xFFFFFFFF) is a random seed per answer (0 here)."""
    if value in (-1, 0xFFFFFFFF):
        return 0
    if not 0 < value < 1 << 32:
        raise UsageError(f"--seed {value}: expected -1 (random) or 1 to {(1 << 32) - 2}")
    return value


def _names(value, flag, model):
    """A comma list of ``--alias`` or ``--tags``; both describe ``--model``."""
    names = tuple(dict.fromkeys(n.strip() for n in (value or "").split(",") if n.strip()))
    if names and model is None:
        raise UsageError(f"{flag} describes the default model: give --model too")
    return names


def _chat_template(args):
    """``--chat-template`` or ``--chat-template-file``, checked before the server listens."""
    from geniex.engine.chat import template_choice
    if args.chat_template and args.chat_template_file:
        raise UsageError("--chat-template and --chat-template-file both name a template; give one")
    if args.chat_template_file:
        if not os.path.isfile(args.chat_template_file):
            raise UsageError(f"--chat-template-file {args.chat_template_file}: no such file")
        return template_choice(args.chat_template_file, "--chat-template-file")
    return template_choice(args.chat_template)


def _keepalive(value):
    raw = value if value is not None else os.environ.get("GENIEX_KEEPALIVE", "300")
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"GENIEX_KEEPALIVE={raw!r}: expected a number of seconds") from None


def run(args):
    """Serve until Ctrl-C / SIGTERM."""
    # Imported here: Flask and waitress are only needed when serving.
    from geniex.server.placement import Defaults
    from geniex.server.app import ServerConfig
    from geniex.server.serving import serve
    from geniex.engine.limits import parse_size
    if args.nctx < 1:
        raise UsageError(f"--nctx must be a positive number of tokens (got {args.nctx})")
    if args.request_timeout is not None and not 0 <= args.request_timeout < 1e9:
        raise UsageError(f"--request-timeout must be a number of seconds >= 0 (got {args.request_timeout:g})")
    if args.load_timeout is not None and not 0 <= args.load_timeout < 1e9:
        raise UsageError(f"--load-timeout must be a number of seconds >= 0 (got {args.load_timeout:g})")
    if not 0 <= args.max_queue <= 256:
        raise UsageError(f"--max-queue must be between 0 and 256 (got {args.max_queue})")
    tls = None
    if args.https:
        if not args.certfile or not args.keyfile:
            raise UsageError("--https needs --certfile and --keyfile (PEM files)")
        tls = (args.certfile, args.keyfile)
    elif args.certfile or args.keyfile:
        raise UsageError("--certfile and --keyfile take effect with --https only; add --https")
    # Load the llama.cpp library now: without one, say what to get before listening,
    # rather than answering every request with the same error.
    from geniex.llama import library
    library.load()
    config = ServerConfig(data_dir=args.data_dir, keepalive=_keepalive(args.keepalive),
                          defaults=Defaults(nctx=args.nctx, ngl=args.ngl, compute=args.compute,
                                            cache_type_k=ggml_name(args.cache_type_k),
                                            cache_type_v=ggml_name(args.cache_type_v), prompt_kv=args.prompt_kv,
                                            chat_template=_chat_template(args),
                                            n_predict=args.n_predict, seed=_seed(args.seed),
                                            reasoning_format=args.reasoning_format, reasoning=args.reasoning,
                                            reasoning_budget=_reasoning_budget(args.reasoning_budget),
                                            reasoning_budget_message=args.reasoning_budget_message,
                                            grammar_dir=_grammar_dir(args.grammar_dir),
                                            spec=spec_options.from_args(args), fixed_load=args.fixed_load,
                                            cache_ram=_cache_ram(args.cache_ram), parallel=_parallel(args.parallel)),
                          origins=args.origins, allowed_hosts=args.allowed_hosts,
                          api_key=args.api_key if args.api_key is not None else os.environ.get("GENIEX_API_KEY", ""),
                          allow_paths=args.allow_paths, max_body=parse_size(args.max_body, "--max-body"),
                          max_queue=args.max_queue,
                          memory_budget=parse_size(args.memory_budget) if args.memory_budget else None,
                          model=_default_model(args.model, args.data_dir),
                          aliases=_names(args.alias, "--alias", args.model), tags=_names(args.tags, "--tags", args.model),
                          webui=args.webui,
                          metrics=args.metrics, slots=args.slots, request_timeout=args.request_timeout,
                          load_timeout=args.load_timeout)
    return serve(config, args.host or os.environ.get("GENIEX_HOST") or DEFAULT_HOST, port=args.port, tls=tls)


MAX_PARALLEL = 64


def _parallel(n):
    """``--parallel``, checked before listening."""
    if not 1 <= n <= MAX_PARALLEL:
        raise UsageError(f"--parallel {n}: expected 1 to {MAX_PARALLEL} slots")
    return n


def _cache_ram(mib):
    """``--cache-ram`` in bytes, checked before listening."""
    if mib < 0:
        raise UsageError(f"--cache-ram {mib}: expected MiB >= 0 (0 = keep no conversation)")
    return mib << 20


def _reasoning_budget(value):
    """``--reasoning-budget`` checked before listening: -1 (no limit) or a token count."""
    if value < -1:
        raise UsageError(f"--reasoning-budget {value}: expected -1 (no limit) or a number of tokens >= 0")
    return value


def _grammar_dir(value):
    """``--grammar-dir`` checked before listening: an existing folder, as an absolute path."""
    if value is None:
        return None
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.isdir(path):
        raise UsageError(f"--grammar-dir {value}: not a folder")
    return path


def _default_model(name, data_dir):
    """``--model`` checked before listening: the name the store resolves it to (a GGUF
    path is the operator's choice, so it is allowed without --allow-paths)."""
    if name is None:
        return None
    from geniex import config
    from geniex.store import Store
    return Store(config.data_dir(data_dir)).resolve(name, paths=True).name
