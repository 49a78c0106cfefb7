"""``geniex run [MODEL]``: chat through a running ``geniex serve``.

Same flags as ``infer``; they travel as request fields. The model is checked with
``GET /v1/models/{id}``, loaded by a warm-up request (empty ``messages`` plus the load
and ``spec_*`` fields, answered ``null``), then each turn is streamed with
``GenieX-KeepCache: true`` so the server decodes only the new tokens, and the profile
is rebuilt from the answer's ``usage`` (:func:`geniex.profile.from_usage`).
"""
import json
import os
import sys
from urllib.parse import quote

from geniex import profile
from geniex.cli import console
from geniex.cli.options import add_chat_verb, gen_options, grammar_source
from geniex.errors import GenieXError, UsageError
from geniex.server import DEFAULT_HOST
from geniex.speculative import options as spec_options

KEEP_CACHE = {"GenieX-KeepCache": "true"}
CONNECT_TIMEOUT = 5      # seconds; reading has no limit (loading a big model takes a while)


def register(sub):
    """Add ``run`` to the CLI."""
    p = add_chat_verb(sub, "run", run, help="chat with a model through a running `geniex serve`",
                      description="Chat with a model through a running `geniex serve` (same flags as "
                                  "infer; speculative settings are sent per request).",
                      spec_trace="not available through the server: use `geniex infer --spec-trace`")
    p.add_argument("--host", default=None, help=f"the server's HOST:PORT (env GENIEX_HOST, default {DEFAULT_HOST})")
    p.add_argument("--api-key", default=None,
                   help="the server's API key, sent as `Authorization: Bearer KEY` (env GENIEX_API_KEY)")


class Client:
    """The few calls ``run`` makes to the server, with errors turned into GenieXError."""

    def __init__(self, host, api_key=None):
        import requests
        self._requests = requests
        self.base = host if host.startswith(("http://", "https://")) else f"http://{host}"
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _call(self, method, path, **kw):
        try:
            response = self.session.request(method, self.base + path, timeout=(CONNECT_TIMEOUT, None), **kw)
        except self._requests.ConnectionError:
            raise GenieXError(f"no geniex server is listening on {self.base}; start one with `geniex serve`") from None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = f"HTTP {response.status_code}: {response.text[:200]}"
            response.close()
            raise GenieXError(f"the server says: {message}")
        return response

    def model_id(self, name):
        """The server's id of ``name`` (``GET /v1/models/{name}``)."""
        return self._call("GET", "/v1/models/" + quote(name, safe="/:")).json()["id"]

    def warm_up(self, fields):
        """Load the model with ``fields`` (its load and ``spec_*`` fields)."""
        self._call("POST", "/v1/chat/completions", json={**fields, "messages": []}, headers=KEEP_CACHE)

    def stream(self, fields, messages):
        """Stream one answer: yields text pieces, then returns ``usage`` (StopIteration value)."""
        from geniex.server.sse import iter_events
        body = {**fields, "messages": messages, "stream": True, "stream_options": {"include_usage": True}}
        usage = None
        with self._call("POST", "/v1/chat/completions", json=body, headers=KEEP_CACHE, stream=True) as response:
            for event in iter_events(response.iter_lines(decode_unicode=True)):
                if "error" in event:
                    raise GenieXError(f"the server says: {event['error'].get('message')}")
                for choice in event.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        yield piece
                usage = event.get("usage") or usage
        return usage


def request_fields(args, model_id):
    """The flags shared with ``infer`` as request fields (load, sampling, ``spec_*``)."""
    opts = gen_options(args)
    s = opts.sampling
    fields = {
        "model": model_id, "nctx": args.nctx, "ngl": args.ngl,
        "cache_type_k": args.cache_type_k, "cache_type_v": args.cache_type_v,
        "max_completion_tokens": opts.max_tokens,
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "seed": s.seed,
    }
    if args.compute:
        fields["compute"] = args.compute
    if opts.stop:
        fields["stop"] = list(opts.stop)
    if getattr(args, "think", None) is not None:
        fields["enable_think"] = args.think
    if args.reasoning_budget >= 0:
        fields["thinking_budget_tokens"] = args.reasoning_budget
    # The answer as the model writes it, thoughts included, as `geniex infer` prints it.
    fields["reasoning_format"] = "none"
    spec = spec_options.from_args(args)
    spec.draft_model = _as_server_name(spec.draft_model) if spec.draft_model else ""
    fields.update(spec_options.to_request(spec))
    source = grammar_source(args)
    if source is not None:
        # The grammar's text travels in the request: a file named here is on this machine,
        # not in the server's grammar folder.
        kind, text, _ = source
        fields["grammar_string" if kind == "gbnf" else "json_schema"] = text if kind == "gbnf" else json.loads(text)
    return fields


def _as_server_name(name):
    # The server runs elsewhere (another working directory): send files as absolute paths.
    expanded = os.path.expanduser(name)
    return os.path.abspath(expanded) if os.path.isfile(expanded) else name


def run(args):
    """Entry point of ``geniex run``."""
    from geniex.store import DEMO_NAME
    if args.spec_trace:
        raise UsageError("--spec-trace needs the decoding steps, which stay inside the server; "
                         "use `geniex infer --spec-trace` instead")
    if args.threads:
        print("note: --threads applies to `geniex infer`; the server picks its own threads", file=sys.stderr)
    if args.prompt_kv != "f16":
        print("note: --prompt-kv applies to `geniex infer`; the server reads prompts as `geniex serve "
              "--prompt-kv` says", file=sys.stderr)
    if args.chat_template:
        print("note: --chat-template applies to `geniex infer`; the server renders with `geniex serve "
              "--chat-template`'s template", file=sys.stderr)
    prompts = console.prompts(args)
    client = Client(args.host or os.environ.get("GENIEX_HOST") or DEFAULT_HOST,
                    args.api_key or os.environ.get("GENIEX_API_KEY"))
    model_id = client.model_id(_as_server_name(args.model or DEMO_NAME))
    fields = request_fields(args, model_id)
    client.warm_up(fields)
    chat = _Chat(client, fields, args.system_prompt, getattr(args, "verbose", False))
    try:
        with console.CtrlC() as ctrl:
            if prompts:
                for prompt in prompts:
                    chat.turn(prompt, ctrl)
            else:
                console.interactive(lambda text: chat.turn(text, ctrl), chat.clear)
    except KeyboardInterrupt:
        print(file=sys.stderr)
    return 0


class _Chat:
    """The conversation kept on this side; the server keeps its KV cache."""

    def __init__(self, client, fields, system_prompt, verbose):
        self.client = client
        self.fields = fields
        self.verbose = verbose
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.messages = list(self.system)

    def turn(self, text, ctrl):
        """Send one user turn, print the answer as it streams, then the profile."""
        self.messages.append({"role": "user", "content": text})
        parts = []
        ctrl.pressed = False
        ctrl.answering = True
        stream = self.client.stream(self.fields, self.messages)
        usage = None
        try:
            while not ctrl.cancelled():
                try:
                    piece = next(stream)
                except StopIteration as done:
                    usage = done.value
                    break
                parts.append(piece)
                sys.stdout.write(piece)
                sys.stdout.flush()
        finally:
            ctrl.answering = False
            stream.close()          # Ctrl-C: closing the connection ends the answer on the server
        self.messages.append({"role": "assistant", "content": "".join(parts)})
        sys.stdout.write("\n")
        sys.stdout.flush()
        if usage:
            print(profile.render(profile.from_usage(usage), self.verbose), file=sys.stderr, flush=True)

    def clear(self):
        """Forget the conversation (the server's cache follows the new prefix)."""
        self.messages = list(self.system)
