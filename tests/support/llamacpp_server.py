"""llama.cpp's own server (``xllamacpp.Server``, the same b11549 library) as the
reference for chat prompts, in a subprocess on a loopback port.

Tests ask it what a chat request becomes: ``POST /apply-template`` (the prompt text
its Jinja engine renders from the GGUF's template), ``POST /tokenize`` with
``add_special`` (the tokens its chat route decodes) and ``/v1/chat/completions``.
It runs in its own process, as tools/bench/bench.py runs it, so that its copy of the
library never shares a process with ours. Settings follow geniex's defaults (n_ubatch
32, every physical core, a q8_0 KV cache) so that greedy answers can be compared.

    python tests/support/llamacpp_server.py MODEL.gguf   # prints the address, serves until stdin closes
"""
import subprocess
import sys
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]


class Reference:
    """The reference server for one model; use as a context manager."""

    def __init__(self, model_path, timeout=120):
        self.proc = subprocess.Popen([sys.executable, __file__, str(model_path)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT)
        line = self.proc.stdout.readline()
        if not line.startswith("http://"):
            self.close()
            raise RuntimeError(f"llama.cpp's server did not start: {line!r}")
        self.url = line.strip()

    def post(self, path, body):
        return requests.post(self.url + path, json=body, timeout=300)

    def prompt(self, body):
        """The prompt text llama.cpp's server renders for a chat request ``body``."""
        r = self.post("/apply-template", body)
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    def tokens(self, body):
        """The prompt tokens of a chat request, as its chat route tokenizes the prompt."""
        r = self.post("/tokenize", {"content": self.prompt(body), "add_special": True, "parse_special": True})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    def close(self):
        # _serve returns when its stdin closes.
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _serve(model_path):
    import xllamacpp as x

    from geniex.config import physical_cores
    p = x.CommonParams()
    p.model.path = model_path
    p.n_ctx = 4096
    p.n_parallel = 1
    p.n_batch = 512
    p.n_ubatch = 32
    p.cpuparams.n_threads = physical_cores()
    p.cpuparams_batch.n_threads = physical_cores()
    p.cache_type_k = p.cache_type_v = x.ggml_type.GGML_TYPE_Q8_0
    p.use_jinja = True
    p.hostnames = ["127.0.0.1"]
    p.port = 0
    server = x.Server(p)
    print(server.listening_address, flush=True)
    sys.stdin.read()       # serve until the test closes our stdin
    del server


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _serve(sys.argv[1])
