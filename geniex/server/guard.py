"""Who may talk to the server: checks made before any route runs.

A local server is reachable by every web page the user opens, so by default:

- **Host**: the ``Host`` header must be a loopback name (``localhost``, ``127.0.0.1``,
  ``[::1]``, ``*.localhost``), the address the server was bound to, or one of
  ``--allowed-hosts``. This defeats DNS rebinding, where an attacker's domain is made
  to resolve to 127.0.0.1 and the page then talks to us "same-origin". 403 otherwise.
- **Origin**: a browser request from another origin (its ``Origin`` header names a
  site other than this server) is refused unless that origin is listed in
  ``--origins``, so a page cannot post even the "simple" requests CORS lets through
  without a preflight. CORS headers are sent only for listed origins (none by default);
  a preflight from another origin gets a 200 without them (the browser's refusal).
- **API key** (``--api-key`` / ``GENIEX_API_KEY``): every request but the open pages
  must carry ``Authorization: Bearer <key>`` or ``X-Api-Key: <key>`` (Anthropic's
  header; compared in constant time); 401 ``authentication_error`` otherwise. Several
  keys (comma separated) let several clients in, each with its own KV cache contents:
  a prompt cached for one key is never reused for (or timed by) another.
  The docs page, ``/openapi.json`` and ``/health`` stay open, so the Swagger page loads
  and its Authorize button takes the key.
"""
import hmac
import ipaddress
from urllib.parse import urlsplit

from flask import Response, g, request

from geniex.server.validation import ApiError

CORS_HEADERS = "Content-Type, Authorization, X-Api-Key, GenieX-KeepCache"
OPEN_PATHS = ("/", "/docs", "/openapi.json", "/health", "/v1/health")


def split_list(text):
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def host_name(host):
    """``"Example.COM:8080"`` -> ``"example.com"``; ``"[::1]:80"`` -> ``"::1"``."""
    host = (host or "").strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def is_loopback(name):
    """Whether a bare host name or address (no port) means this machine only."""
    name = (name or "").strip("[]").lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Guard:
    """The checks of the module doc, from a ServerConfig."""

    def __init__(self, config):
        self.origins = split_list(config.origins)
        self.hosts = {host_name(h) for h in split_list(config.allowed_hosts)}
        for bound in split_list(config.bind_host):
            bind = host_name(bound) if ":" not in bound.strip("[]") else bound.strip("[]").lower()
            if bind and bind not in ("0.0.0.0", "::"):
                self.hosts.add(bind)
        self.keys = [key.encode() for key in split_list(config.api_key or "")]

    def host_allowed(self, host):
        name = host_name(host)
        return "*" in self.hosts or is_loopback(name) or name in self.hosts

    def listed(self, origin):
        """Whether ``--origins`` lets ``origin`` in: ``*``; the origin itself
        (``http://host:port``); a bare host name, any scheme and port
        (``web.example.com``); or ``localhost``, any loopback origin (llama.cpp's forms)."""
        if "*" in self.origins or origin in self.origins:
            return True
        try:
            host = urlsplit(origin if "://" in origin else "//" + origin).hostname or ""
        except ValueError:
            return False
        return any(entry == host or (entry == "localhost" and is_loopback(host))
                   for entry in self.origins if "://" not in entry)

    def origin_allowed(self, origin):
        if self.listed(origin):
            return True
        # The server's own pages (the Swagger UI) send their own origin.
        try:
            return urlsplit(origin).netloc.lower() == (request.host or "").lower()
        except ValueError:
            return False

    def check(self):
        """Before every request: raise an ApiError for a refused one."""
        if not self.host_allowed(request.host):
            raise ApiError(403, f"Host {request.host!r} is not allowed: use localhost, or start the server "
                           "with --allowed-hosts NAME", code="host_not_allowed")
        origin = request.headers.get("Origin")
        if origin is not None and not self.origin_allowed(origin):
            if request.method == "OPTIONS":
                # A preflight is answered as llama-server answers it: 200 without CORS
                # headers, which the browser takes as a refusal (nothing is sent after it).
                return Response(status=200)
            raise ApiError(403, f"requests from the web page origin {origin!r} are not allowed; start the "
                           "server with --origins to allow it", code="origin_not_allowed")
        if request.method == "OPTIONS" or not self.keys or self._open(request.path):
            return
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            given = request.headers.get("X-Api-Key", "")
        given = given.strip().encode()
        # Every key is compared (in constant time each), so the time taken says nothing
        # about which key came close.
        matched = [i for i, key in enumerate(self.keys) if hmac.compare_digest(given, key)]
        g.geniex_api_key = matched[0] if matched else None     # whose cached prompts it may reuse
        if not matched:
            raise ApiError(401, "missing or incorrect API key: send `Authorization: Bearer <key>` or "
                           "`X-Api-Key: <key>` (the server's --api-key / GENIEX_API_KEY)", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    @staticmethod
    def _open(path):
        return path in OPEN_PATHS or path.startswith("/docs/")

    def cors(self, response):
        """After every request: CORS headers for a listed origin only."""
        origin = request.headers.get("Origin")
        if not self.origins:
            return response
        if "*" in self.origins:
            response.headers["Access-Control-Allow-Origin"] = "*"
        elif origin and self.listed(origin):
            response.headers["Access-Control-Allow-Origin"] = origin
            response.vary.add("Origin")
        else:
            return response
        response.headers["Access-Control-Allow-Headers"] = CORS_HEADERS
        response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        return response


def install(app, config):
    """Run :class:`Guard` before and after every request of ``app``."""
    guard = Guard(config)
    app.before_request(guard.check)
    app.after_request(guard.cors)
    return guard
