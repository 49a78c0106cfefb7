"""``GET /metrics``: Prometheus text with llama.cpp's server metric names, plus the
speculative counters per drafting method that vLLM reports.

The counters are kept here (:meth:`Metrics.record` after every answer, from its
:class:`~geniex.engine.stats.Stats`) and read by a prometheus_client collector when
scraped, so the text format, escaping and ``# HELP``/``# TYPE`` lines come from the
library Prometheus maintains rather than from code of ours.

- ``llamacpp:*``: the names llama.cpp's ``/metrics`` uses (prompt and predicted token
  counts and seconds, decode calls, throughput gauges, requests processing/deferred,
  and its speculative totals ``spec_decode_num_drafts/draft_tokens/accepted_tokens``).
- ``geniex:spec_decode_*{method=...}``: the same per drafting method, plus verify steps
  and a histogram of accepted draft tokens per verify step (vLLM's acceptance view).
"""
import math
import threading
import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from geniex.llama.kv import PROMPT_CHUNK

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ACCEPT_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64, 128, 256)


class Metrics:
    """Totals since the server started, updated after each answer (thread-safe)."""

    def __init__(self, cache=None):
        self.cache = cache                 # for requests processing / deferred
        self.started = time.time()
        self._lock = threading.Lock()
        self.prompt_tokens = 0             # decoded prompt tokens (not counting cached ones)
        self.prompt_cached = 0
        self.prompt_seconds = 0.0
        self.predicted = 0
        self.predicted_seconds = 0.0
        self.decodes = 0
        self.tokens_max = 0
        self.drafts = 0                    # verify steps that carried a draft
        self.draft_tokens = 0
        self.accepted = 0
        self.by_method = {}                # method -> [steps with a draft, drafted, accepted, accept_hist]
        self.queue_seconds = 0.0           # time requests waited for the model, in total
        self.queue_requests = 0
        self.queue_max = 0.0
        self.timeouts = 0                  # answers cut by the request timeout
        self.crashes = 0                   # worker processes that died under a request
        self.load_timeouts = 0             # model loads stopped at their bound (--load-timeout)
        self.prompt_cache = None           # the resident model's saved conversations, as its last answer saw them

    def record(self, stats):
        """Count one finished answer."""
        with self._lock:
            decoded = stats.prompt_tokens - stats.prompt_reused
            self.prompt_tokens += decoded
            self.prompt_cached += stats.prompt_reused
            self.prompt_seconds += stats.prompt_time
            self.predicted += stats.decode_tokens
            self.predicted_seconds += stats.decode_time
            self.decodes += stats.steps + math.ceil(max(decoded - 1, 0) / PROMPT_CHUNK)
            self.tokens_max = max(self.tokens_max, stats.prompt_tokens + stats.decode_tokens)
            if stats.stop_reason == "time_limit":
                self.timeouts += 1
            self.drafts += sum(stats.accept_hist)
            self.draft_tokens += stats.drafted
            self.accepted += stats.accepted
            for method, (steps, drafted, accepted, hist) in stats.by_method.items():
                mine = self.by_method.setdefault(method, [0, 0, 0, []])
                mine[0] += steps
                mine[1] += drafted
                mine[2] += accepted
                while len(mine[3]) < len(hist):
                    mine[3].append(0)
                for n, count in enumerate(hist):
                    mine[3][n] += count

    def record_wait(self, seconds):
        """Count the time one request waited for its turn on the model."""
        with self._lock:
            self.queue_seconds += seconds
            self.queue_requests += 1
            self.queue_max = max(self.queue_max, seconds)

    def record_failure(self, code):
        """Count a request that ended by ``request_timeout``, ``model_crashed`` or
        ``load_timeout``."""
        with self._lock:
            if code == "request_timeout":
                self.timeouts += 1
            elif code == "model_crashed":
                self.crashes += 1
            elif code == "load_timeout":
                self.load_timeouts += 1

    def record_prompt(self, tokens, seconds, decodes):
        """Count a task that decodes a prompt without predicting (embeddings, rerank)."""
        with self._lock:
            self.prompt_tokens += tokens
            self.prompt_seconds += seconds
            self.decodes += decodes

    # -- prometheus_client collector ---------------------------------------------------
    def collect(self):
        with self._lock:
            yield from self._llamacpp()
            yield from self._per_method()

    def _llamacpp(self):
        def counter(name, doc, value):
            family = CounterMetricFamily(f"llamacpp:{name}", doc)
            family.add_metric([], value)
            return family

        def gauge(name, doc, value):
            return GaugeMetricFamily(f"llamacpp:{name}", doc, value=value)

        yield counter("prompt_tokens", "Number of prompt tokens processed.", self.prompt_tokens)
        yield counter("prompt_tokens_cached", "Number of prompt tokens taken from the KV cache.", self.prompt_cached)
        yield counter("prompt_seconds", "Prompt process time.", self.prompt_seconds)
        yield counter("tokens_predicted", "Number of generation tokens processed.", self.predicted)
        yield counter("tokens_predicted_seconds", "Predict process time.", self.predicted_seconds)
        yield counter("n_decode", "Number of llama_decode() calls.", self.decodes)
        # llama.cpp types this maximum a counter with no _total suffix, which
        # prometheus_client refuses to build: made a gauge here, typed as llama.cpp
        # types it in :meth:`exposition`.
        yield gauge("n_tokens_max", "Largest observed n_tokens.", self.tokens_max)
        yield counter("spec_decode_num_drafts", "Verify steps that carried a draft.", self.drafts)
        yield counter("spec_decode_num_draft_tokens", "Draft tokens verified by the target.", self.draft_tokens)
        yield counter("spec_decode_num_accepted_tokens", "Draft tokens the target accepted.", self.accepted)
        yield gauge("prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
                    self.prompt_tokens / self.prompt_seconds if self.prompt_seconds > 0 else 0.0)
        yield gauge("predicted_tokens_seconds", "Average generation throughput in tokens/s.",
                    self.predicted / self.predicted_seconds if self.predicted_seconds > 0 else 0.0)
        yield gauge("requests_processing", "Number of requests processing.",
                    self.cache.in_use() if self.cache is not None else 0)
        yield gauge("requests_deferred", "Number of requests deferred.",
                    self.cache.waiting() if self.cache is not None else 0)
        report = (self.cache.slots() if self.cache is not None else None) or {}
        seats, decodes = report.get("seats"), report.get("decodes")
        yield gauge("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call.",
                    seats / decodes if seats and decodes else (1.0 if self.decodes else 0.0))

    def _per_method(self):
        labels = ["method"]
        steps = CounterMetricFamily("geniex:spec_decode_num_drafts", "Verify steps that carried a draft, "
                                    "per drafting method.", labels=labels)
        drafted = CounterMetricFamily("geniex:spec_decode_num_draft_tokens", "Draft tokens verified, per "
                                      "drafting method.", labels=labels)
        accepted = CounterMetricFamily("geniex:spec_decode_num_accepted_tokens", "Draft tokens accepted, per "
                                       "drafting method.", labels=labels)
        hist = HistogramMetricFamily("geniex:spec_decode_accepted_length", "Accepted draft tokens per verify "
                                     "step, per drafting method.", labels=labels)
        for method, (n_steps, n_drafted, n_accepted, counts) in sorted(self.by_method.items()):
            steps.add_metric([method], n_steps)
            drafted.add_metric([method], n_drafted)
            accepted.add_metric([method], n_accepted)
            buckets = [(str(le), sum(c for n, c in enumerate(counts) if n <= le)) for le in ACCEPT_BUCKETS]
            buckets.append(("+Inf", sum(counts)))
            hist.add_metric([method], buckets, sum_value=float(sum(n * c for n, c in enumerate(counts))))
        yield from (steps, drafted, accepted, hist)
        yield CounterMetricFamily("geniex:queue_wait_seconds", "Time requests waited for the model.",
                                  value=self.queue_seconds)
        yield CounterMetricFamily("geniex:queue_requests", "Requests that got a turn on the model.",
                                  value=self.queue_requests)
        yield GaugeMetricFamily("geniex:queue_wait_seconds_max", "Longest wait for the model so far.",
                                value=self.queue_max)
        yield CounterMetricFamily("geniex:request_timeouts", "Requests cut by the request timeout.",
                                  value=self.timeouts)
        yield CounterMetricFamily("geniex:worker_crashes", "Worker processes that died under a request.",
                                  value=self.crashes)
        yield CounterMetricFamily("geniex:load_timeouts", "Model loads stopped at their bound.",
                                  value=self.load_timeouts)
        cached = self.prompt_cache or {}
        yield GaugeMetricFamily("geniex:prompt_cache_entries", "Conversations kept in host memory (--cache-ram).",
                                value=cached.get("entries", 0))
        yield GaugeMetricFamily("geniex:prompt_cache_bytes", "Host memory the kept conversations take.",
                                value=cached.get("bytes", 0))
        yield GaugeMetricFamily("geniex:prompt_cache_capacity_bytes", "The bound on it (--cache-ram).",
                                value=cached.get("capacity", 0))
        yield CounterMetricFamily("geniex:prompt_cache_restored", "Conversations put back from host memory "
                                  "into the context (since the model was loaded).", value=cached.get("restored", 0))
        if self.cache is not None:
            yield CounterMetricFamily("geniex:model_loads", "Models loaded since the server started.",
                                      value=self.cache.loads)
            yield CounterMetricFamily("geniex:model_reloads", "Loads that replaced a resident model (another "
                                      "model or other load settings were requested).", value=self.cache.reloads)

    def exposition(self):
        """The Prometheus text of every metric."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        # As llama-server exports it (a scraper reading llama.cpp's types finds the same).
        return generate_latest(registry).replace(b"# TYPE llamacpp:n_tokens_max gauge",
                                                 b"# TYPE llamacpp:n_tokens_max counter")
