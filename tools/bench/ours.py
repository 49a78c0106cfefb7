"""Our side of the bench: a geniex Session answering as ``geniex infer`` does, in a worker."""
import time

from configs import NCTX


def as_llama_counts(stats, first_s, first_n):
    """(answer tokens, decode seconds) of an answer's Stats, counted as llama.cpp's server
    counts ``predicted_n`` over ``predicted_ms``; ``first_s``/``first_n``: the first step's
    time and committed tokens.

    Its first token comes from the prompt's batch (no decode on its clock) and an end
    token counts. Ours decodes the prompt's last token in the first step and leaves an end
    token out of ``decode_tokens``: a 25-token answer that ended on its end token was 25
    tokens over 26 decodes against its 26 over 25 (0.92x at equal decode speed). So the
    first step's time is off the clock and only its first token counts (a draft it
    accepted goes uncounted: the error is against ours), and an end token counts."""
    n = stats.decode_tokens - max(0, first_n - 1) + (stats.stop_reason == "eos")
    return n, max(0.0, stats.decode_time - first_s)


class Runner:
    """A Session loaded with one configuration; answers token-id prompts."""

    def __init__(self, cfg, model_path):
        from geniex.engine.session import LoadOptions, open_session
        from geniex.store.resolved import from_gguf_path
        from geniex.speculative.options import SpecOptions
        spec = SpecOptions()
        if cfg.spec:
            n, lo, hi = cfg.ngram or (0, 0, 0)
            spec = SpecOptions(types=(cfg.spec,), ngram_n=n, ngram_min=lo, ngram_max=hi, policy=cfg.policy)
        opts = LoadOptions(nctx=NCTX, threads=cfg.threads, threads_batch=cfg.threads_batch, spec=spec)
        if cfg.ubatch:
            opts.n_ubatch = cfg.ubatch
        if cfg.cache:
            opts.cache_type_k = opts.cache_type_v = cfg.cache
        self.cfg = cfg
        self.s = open_session(from_gguf_path(model_path), opts)
        if cfg.spec and self.s.drafter is None:
            raise SystemExit(f"{cfg.name}: speculative setup failed: {self.s.spec_notes}")
        # The verify cost curve the draft policy measured at load (rows -> one-row decodes).
        costs = getattr(self.s.policy, "measured", None)   # as measured: stalls show (bench warns)
        # Decodes the thread governor ran on one thread (its probes, or a switch under
        # load), counted per answer: a probe that lands on a long verify batch costs that
        # answer several one-row decodes.
        self.one_thread = [0, 0]
        gov = self.s.ctx.governor
        if gov is not None:
            observe = gov.observe

            def counted(rows, seconds):
                if gov.active == "one":
                    self.one_thread[0] += 1
                    self.one_thread[1] += rows
                observe(rows, seconds)
            gov.observe = counted
        self.hello = {"model_bytes": self.s.model.size_bytes, "notes": self.s.spec_notes,
                      "threads": [self.s.threads, self.s.threads_batch],
                      "verify_cost": {str(r): c for r, c in costs.items()} if costs else None}

    def tokenize(self, messages):
        """The prompt token ids of a chat (the model's template, as the server renders it)."""
        from geniex.engine.chat import template_for
        return self.s.tokenize_prompt(template_for(self.s.model).render(messages))

    def run(self, tokens, n):
        """Answer ``tokens`` with at most ``n`` tokens, greedy; what the report reads."""
        from geniex.engine.loop import GenOptions
        from geniex.engine.sampling import SamplingParams
        if self.cfg.fresh:
            self.s.reset(drafts=True)
        gov = self.s.ctx.governor
        one_before, switches_before = list(self.one_thread), gov.switches if gov is not None else 0
        gen = self.s.generate(tokens, GenOptions(max_tokens=n, sampling=SamplingParams(seed=1)))
        steps, rows_s, prev, first = [], {}, 1, (0.0, 0)
        for step in gen:
            if step.index == 0:
                first = (step.draft_time + step.verify_time, len(step.committed))
            if self.cfg.detail and (step.drafted or step.extra.get("offered")):
                # position in the answer, drafted, accepted, offered, grade
                steps.append([step.n_past - len(tokens) + 1, len(step.drafted), step.accepted,
                              step.extra.get("offered", len(step.drafted)), step.extra.get("grade", 0)])
            if step.verify_time and step.index > 0:
                # The answer's own verify cost by rows (the first step, which decodes the
                # prompt's last token, apart); a one-row step right after a batch ("1+")
                # builds its graph again.
                rows = len(step.drafted) + 1
                rec = rows_s.setdefault("1+" if rows == 1 and prev > 1 else str(rows), [0, 0.0])
                rec[0] += 1
                rec[1] += step.verify_time
                prev = rows
        st = gen.stats
        one = [a - b for a, b in zip(self.one_thread, one_before)]
        switches = (gov.switches if gov is not None else 0) - switches_before
        n, decode_s = as_llama_counts(st, *first)
        return {"tokens": list(gen.tokens), "text": gen.text, "n": n, "decode_s": decode_s,
                "steps": st.steps, "drafted": st.drafted, "accepted": st.accepted, "offered": st.offered,
                "hist": list(st.accept_hist), "draft_s": st.draft_time, "verify_s": st.verify_time,
                "prompt": st.prompt_tokens, "prompt_reused": st.prompt_reused, "stop": st.stop_reason,
                "detail": steps, "rows_s": rows_s,
                "one_thread": one + [switches] if any(one) or switches else None}

    def row_cost(self, ks=(1, 2, 4, 8), reps=2):
        """Seconds of a k-row decode (logits on every row) after a 100-token prefix: the
        bench's check for stalled multi-threaded batches (a busy machine)."""
        s = self.s
        ctx, b = s.ctx, s.batch
        s.reset()
        ctx.decode(b.fill(list(range(1000, 1100)), 0))
        out = {}
        for k in ks:
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                ctx.decode(b.fill(list(range(2000, 2000 + k)), 100, all_logits=True))
                best = min(best, time.perf_counter() - t)
                ctx.trim(100)
            out[k] = best
        s.reset()
        return out
