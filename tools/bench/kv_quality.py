"""What a quantized KV cache costs in quality: next-token distributions, F16 cache vs others.

Teacher-forced over a few thousand tokens of real English prose (the language reference
chapters that ship with CPython in ``pydoc_data/topics.py``), in chunks of ``--chunk``
tokens that each start with an empty cache and BOS. For every position both contexts see
the same tokens; we compare the next-token distributions of the F16-cache context (p)
and of the quantized-cache context (q):

- mean KL(p || q) in nats (also the 99th percentile and the maximum);
- top-1 agreement: how often the argmax (the greedy choice) is the same;
- the perplexity of the text under each (a sanity check: it should barely move).

Uses geniex's own ctypes layer (geniex.llama), one context per cache type, the same
thread count for all (default 1). Quality does not depend on machine load; the run just takes longer.

    python tools/bench/kv_quality.py [--model PATH] [--tokens 4096] [--chunk 1024] [--types bf16,q8_0,q4_0]
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from geniex.llama import cache_types  # noqa: E402
from geniex.llama.objects import Batch, Context, Model  # noqa: E402

# Prose-heavy chapters of the language reference (few code listings), in this order.
TOPICS = ["execmodel", "naming", "exceptions", "import", "customization", "datamodel", "types"]
SUB = 128   # rows decoded (and scored) per llama_decode: bounds memory (float64 log-probs, 50 MB)


def prose():
    """English text from CPython's bundled pydoc topics (no download, same on every machine)."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in TOPICS if k in topics)


def log_softmax(x):
    x = x.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def chunk_logprobs(ctx, batch, tokens):
    """Teacher-force ``tokens`` from an empty cache; yield (row offset, log-probs) per sub-batch."""
    ctx.clear()
    for start in range(0, len(tokens), SUB):
        rows = tokens[start:start + SUB]
        ctx.decode(batch.fill(rows, start, all_logits=True))
        yield start, log_softmax(np.stack([ctx.logits(i) for i in range(len(rows))]))


def measure(model, text_tokens, types, *, chunk, threads):
    """Per cache type: arrays of KL(p_f16 || p_type) and top-1 agreement per position, and
    the log-likelihood of the text under each type (including f16)."""
    names = ["f16"] + list(types)
    ctxs = {n: Context(model, n_ctx=chunk, n_batch=SUB, n_ubatch=SUB, n_threads=threads,
                       n_threads_batch=threads, type_k=n, type_v=n) for n in names}
    batch = Batch(SUB)
    kl = {n: [] for n in types}
    agree = {n: [] for n in types}
    nll = {n: [] for n in names}
    body = chunk - 1                      # BOS + body tokens per chunk
    for c0 in range(0, len(text_tokens) - 1, body):
        toks = [model.vocab.bos] + text_tokens[c0:c0 + body]
        # Row i predicts text_tokens[c0 + i]. Row 0 (BOS alone) is not scored: it is the
        # same context-free guess in every chunk. At the end of the text the last row has
        # no next token and is not scored either.
        targets = np.array(text_tokens[c0:c0 + len(toks)], dtype=np.int64)
        n_scored = len(targets)
        gens = {n: chunk_logprobs(ctxs[n], batch, toks) for n in names}
        # Contexts are stepped in lockstep, one sub-batch each, so only one sub-batch of
        # log-probs per type is alive at a time.
        for parts in zip(*(gens[n] for n in names)):
            start = parts[0][0]
            lp = {n: p for n, (_, p) in zip(names, parts)}
            lo, stop = (1 if start == 0 else 0), min(len(lp["f16"]), n_scored - start)
            if stop <= lo:
                continue
            tgt = targets[start + lo:start + stop]
            p_log = lp["f16"][lo:stop]
            p = np.exp(p_log)
            top_p = p_log.argmax(axis=1)
            for n in names:
                nll[n].append(-lp[n][np.arange(lo, stop), tgt])
            for n in types:
                q_log = lp[n][lo:stop]
                kl[n].append((p * (p_log - q_log)).sum(axis=1))
                agree[n].append(q_log.argmax(axis=1) == top_p)
    for c in ctxs.values():
        c.close()
    cat = np.concatenate
    return ({n: cat(kl[n]) for n in types}, {n: cat(agree[n]) for n in types},
            {n: cat(nll[n]) for n in names})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="GGUF model (default: the bundled demo model)")
    ap.add_argument("--tokens", type=int, default=4096, help="text tokens to score")
    ap.add_argument("--chunk", type=int, default=1024, help="context length per chunk (KV cells)")
    ap.add_argument("--types", default="bf16,q8_0,q4_0",
                    help="cache types compared with f16 (K and V)")
    ap.add_argument("--threads", type=int, default=1,
                    help="threads per context (1: no OpenMP spin stalls on a busy machine)")
    args = ap.parse_args(argv)
    if args.model is None:
        from geniex.store import demo_model_path
        args.model = demo_model_path()
    types = [cache_types.name_of(cache_types.parse(t)) for t in args.types.split(",") if t.strip()]
    model = Model(args.model)
    text_tokens = model.vocab.tokenize(prose(), add_special=False)[:args.tokens + 1]
    t0 = time.time()
    kl, agree, nll = measure(model, text_tokens, types, chunk=args.chunk, threads=args.threads)
    n = len(nll["f16"])
    print(f"{model.describe()} ({Path(args.model).name}), {n} positions of pydoc_data prose "
          f"in chunks of {args.chunk} KV cells, {time.time() - t0:.0f} s\n")
    print("| KV cache (K and V) | mean KL(p_f16 ‖ p) nats | p99 KL | max KL | top-1 agreement | perplexity |")
    print("|---|---|---|---|---|---|")
    print(f"| f16 (reference) | 0 | 0 | 0 | 100% | {np.exp(nll['f16'].mean()):.3f} |")
    for t in types:
        print(f"| {t} | {kl[t].mean():.5f} | {np.percentile(kl[t], 99):.4f} | {kl[t].max():.3f} "
              f"| {100 * agree[t].mean():.2f}% ({int(agree[t].sum())}/{n}) | {np.exp(nll[t].mean()):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
