#!/usr/bin/env python3
"""What a verify batch of k rows costs, by the KV position it is decoded at: a table.

    python tools/bench/verify_cost.py [--threads 1] [--positions 0,256,512,1024] [--repeats 7]

The demo model's cache is filled with real text (the language reference shipped with
CPython, as ``kv_quality.py``) up to each position; there a decode of k rows (logits on
every row, as a verify) is timed against a one-row decode at the same position, each after
a one-row decode (as in an answer) and trimmed back after it. Positions and sizes take
turns in every repeat (sizes alternate their order; positions go from the highest down, the
cache filled again each repeat), so a slow spell of a shared machine falls on all of them alike;
the median of ``--repeats`` counts. With ``--threads 1`` (the default) the decode runs in
this thread and is timed in its CPU time (``time.thread_time``), which a busy neighbour
cannot stretch; with more threads the wall clock is used and is only as good as the
machine is quiet. Printed: the one-row decode in ms and k rows in one-row decodes, by
position, and the load average before and after.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from report import table  # noqa: E402

ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)


def text_tokens(s, n):
    """``n`` tokens of English prose (pydoc's topics), BOS first."""
    from pydoc_data.topics import topics
    text = "\n\n".join(topics[k] for k in sorted(topics))
    toks = s.vocab.tokenize(text[: n * 8], add_special=True, parse_special=False)
    if len(toks) < n + 16:
        raise SystemExit("not enough text for that position")
    return toks


def measure(s, positions, rows, repeats, clock):
    """{position: {rows: [seconds, ...]}} of decodes at each position."""
    ctx, batch = s.ctx, s.batch
    top = max(positions)
    toks = text_tokens(s, top + max(rows) + 1)
    times = {p: {r: [] for r in rows} for p in positions}
    for rep in range(repeats):
        ctx.clear()
        done = 0
        while done < top:                 # the cache up to the highest position (trimming removes it)
            n = min(256, top - done)
            ctx.decode(batch.fill(toks[done:done + n], done))
            done += n
        for p in positions[::-1]:         # highest first: each position trims the cache down to it
            for r in (rows if rep % 2 == 0 else rows[::-1]):
                ctx.trim(p)
                ctx.decode(batch.fill([toks[p]], p, all_logits=True))    # the step before
                ctx.trim(p)
                batch.fill(toks[p:p + r], p, all_logits=True)
                t0 = clock()
                ctx.decode(batch)
                times[p][r].append(clock() - t0)
    ctx.clear()
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="decode threads (1: this thread's CPU time; 0: every core, wall clock)")
    ap.add_argument("--positions", type=lambda s: [int(x) for x in s.split(",")], default=[0, 256, 512, 1024])
    ap.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=list(ROWS))
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    from geniex.engine.session import LoadOptions, Session
    from geniex.store.demo import demo_model_path
    rows = sorted(set([1, *args.rows]))
    positions = sorted(set(args.positions))
    print(f"# load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as data_dir:
        s = Session(demo_model_path(), LoadOptions(nctx=max(positions) + max(rows) + 64, threads=args.threads,
                                                   threads_batch=args.threads, adaptive_threads=False,
                                                   data_dir=data_dir))
        clock = time.thread_time if args.threads == 1 else time.perf_counter
        times = measure(s, positions, rows, args.repeats, clock)
        s.close()
    print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# {s.options.cache_type_k} KV cache, threads {args.threads or 'every core'}, "
          f"{'CPU time of this thread' if args.threads == 1 else 'wall clock'}, median of {args.repeats}\n")
    head = ["position", "1 row (ms)", *[f"{r} rows" for r in rows if r > 1]]
    out = []
    for p in positions:
        one = statistics.median(times[p][1])
        out.append([str(p), f"{one * 1000:.2f}",
                    *[f"{statistics.median(times[p][r]) / one:.2f}" for r in rows if r > 1]])
    print(table(head, out))


if __name__ == "__main__":
    main()
