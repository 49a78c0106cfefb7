"""llama.cpp's side of the bench: its own server loop (``xllamacpp.Server``, the same b11549
library, driven by its C++ server and speculative code), in a worker process of its own.

Only the benchmarks use xllamacpp's Python API; geniex never does. The server's HTTP
listener is bound to 127.0.0.1; requests go through ``Server.handle_completions`` with the
prompt as token ids (ours' tokenization of the same chat), greedy, ``cache_prompt`` on:
the server keeps the conversation's KV cache and its ngram-mod table across requests.
"""
from configs import NCTX

SPEC_TYPES = {"ngram-mod": "COMMON_SPECULATIVE_TYPE_NGRAM_MOD",
              "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE"}


class Runner:
    """One llama.cpp server, one slot, at this configuration's settings (unset: its defaults)."""

    def __init__(self, cfg, model_path):
        import xllamacpp as x
        p = x.CommonParams()
        p.model.path = str(model_path)
        p.n_ctx = NCTX
        p.n_parallel = 1
        if cfg.threads:
            p.cpuparams.n_threads = cfg.threads
            p.cpuparams_batch.n_threads = cfg.threads_batch or cfg.threads
        if cfg.ubatch:
            p.n_ubatch = cfg.ubatch
        if cfg.cache:
            p.cache_type_k = p.cache_type_v = getattr(x.ggml_type, "GGML_TYPE_" + cfg.cache.upper())
        p.hostnames = ["127.0.0.1"]
        p.port = 0
        if cfg.spec:
            if cfg.spec not in SPEC_TYPES:
                raise SystemExit(f"{cfg.name}: the bench drives native {', '.join(SPEC_TYPES)} only")
            sp = p.speculative
            sp.types = [getattr(x.common_speculative_type, SPEC_TYPES[cfg.spec])]
            if cfg.spec == "ngram-mod" and cfg.ngram:
                sp.ngram_mod.n_match, sp.ngram_mod.n_min, sp.ngram_mod.n_max = cfg.ngram
            elif cfg.spec == "ngram-simple" and cfg.ngram:
                n, _lo, hi = cfg.ngram
                sp.ngram_simple.size_n, sp.ngram_simple.size_m, sp.ngram_simple.min_hits = n, hi, 1
        self.server = x.Server(p)
        # One tiny request first: the first decode allocates the graph (ours does it at load).
        self.server.handle_completions({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})
        self.hello = {"address": self.server.listening_address}

    def run(self, tokens, n):
        r = self.server.handle_completions({"prompt": tokens, "max_tokens": n, "temperature": 0.0,
                                            "cache_prompt": True, "stream": False})
        if "choices" not in r:
            raise SystemExit(f"native server error: {r}")
        t = r.get("timings", {})
        return {"tokens": [], "text": r["choices"][0]["text"], "n": t.get("predicted_n", 0),
                "decode_s": t.get("predicted_ms", 0.0) / 1000, "steps": 0,
                "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0),
                "prompt": t.get("prompt_n", 0) + t.get("cache_n", 0), "prompt_reused": t.get("cache_n", 0),
                "stop": r["choices"][0].get("finish_reason", "")}
