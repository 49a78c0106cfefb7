"""One-row decodes and 2/5-row batches under a busy neighbour: OpenMP wait policy x threads.

The prebuilt library runs ggml's CPU graph with OpenMP (the system libgomp): every op
ends in an OpenMP barrier, and libgomp's waiting threads spin before they sleep. When
another process occupies a core, a spinning thread can hold the CPU its partner needs,
so each of the graph's several hundred barriers may wait for a scheduler slice.

This tool times ``llama_decode`` for a 1-row decode and 2- and 5-row batches (the shapes
of plain decoding and of speculative verification) at KV position ``--pos``, for each
setting:

- threads: ``1`` (one-row and batches on 1 thread), ``2`` (both on 2), ``1/2`` (one-row
  decodes on 1 thread, batches on 2: ``llama_set_n_threads`` between decodes);
- wait policy: ``default`` (libgomp's: spin ~300k iterations, then sleep), ``active``
  (``OMP_WAIT_POLICY=active``: spin), ``passive`` (``OMP_WAIT_POLICY=passive``: sleep at
  once); ``spin10k`` (``GOMP_SPINCOUNT=10000``: a short spin; ask with ``--policies``).
  libgomp reads these once, when the library is loaded, so each policy runs in its own
  worker process with the variable set before ``geniex.llama.library.load()``.

``--neighbour`` starts a busy-looping process pinned to CPU 0 for the whole run (stopped
at the end). Settings are interleaved over ``--rounds`` rounds (one worker process per
policy per round) so slow drifts in the machine's load hit every setting alike; the table
gives medians over all rounds, in ms, and each batch's cost relative to a one-row decode
of the same setting.

    python tools/bench/bench_contention.py [--neighbour] [--rounds 3] [--reps 8] [--pos 300]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
POLICIES = {"default": {}, "active": {"OMP_WAIT_POLICY": "active"},
            "passive": {"OMP_WAIT_POLICY": "passive"}, "spin10k": {"GOMP_SPINCOUNT": "10000"}}
THREADS = {"1": (1, 1), "2": (2, 2), "1/2": (1, 2)}
SHAPES = (1, 2, 5)


def worker(args):
    """Runs in a child process whose OMP_* environment is already set: prints JSON
    {setting: {rows: [ms, ...]}} for every thread setting."""
    sys.path.insert(0, str(ROOT))
    from geniex.llama.objects import Batch, Context, Model
    from geniex.store import demo_model_path
    model = Model(args.model or demo_model_path())
    ctx = Context(model, n_ctx=max(1024, args.pos + 64), n_batch=512, n_ubatch=512,
                  n_threads=2, n_threads_batch=2, type_k=args.cache, type_v=args.cache)
    batch = Batch(512)
    text = "Every token the model writes is read back before the next one is chosen. " * 80
    prompt = model.vocab.tokenize(text, add_special=True)[:args.pos]
    for i in range(0, len(prompt), 512):
        ctx.decode(batch.fill(prompt[i:i + 512], i))
    nxt = prompt[1:6]
    out = {name: {n: [] for n in SHAPES} for name in args.threads.split(",")}
    deadline = time.monotonic() + args.budget
    for rep in range(args.reps):
        for name in out:
            ctx.set_threads(*THREADS[name])
            for n in SHAPES:
                t0 = time.perf_counter()
                ctx.decode(batch.fill(nxt[:n], len(prompt), all_logits=True))
                out[name][n].append(1000 * (time.perf_counter() - t0))
                ctx.trim(len(prompt))
        if time.monotonic() > deadline:      # a stalled setting must not hold the run for hours
            break
    print(json.dumps(out))


def start_neighbour(cpu):
    """A busy-looping process pinned to ``cpu`` (the reproducible busy neighbour)."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--neighbour", action="store_true", help="run a busy loop pinned to CPU 0")
    ap.add_argument("--rounds", type=int, default=3, help="worker processes per policy")
    ap.add_argument("--reps", type=int, default=8, help="timed decodes per shape and setting per worker")
    ap.add_argument("--pos", type=int, default=300, help="KV position of the timed rows")
    ap.add_argument("--cache", default="q8_0", help="KV cache type (K and V)")
    ap.add_argument("--policies", default="default,active,passive")
    ap.add_argument("--threads", default="1,2,1/2", help="settings: 1, 2, 1/2 (one-row/batch)")
    ap.add_argument("--budget", type=float, default=60, help="seconds per worker before it stops early")
    ap.add_argument("--model")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)

    policies = args.policies.split(",")
    results = {(p, t): {n: [] for n in SHAPES} for p in policies for t in args.threads.split(",")}
    neighbour = start_neighbour(0) if args.neighbour else None
    load0 = os.getloadavg()[0]
    t_start = time.perf_counter()
    try:
        for r in range(args.rounds):
            for p in policies:
                env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
                env.update(POLICIES[p])
                cmd = [sys.executable, __file__, "--worker", "--reps", str(args.reps), "--pos", str(args.pos),
                       "--cache", args.cache, "--threads", args.threads, "--budget", str(args.budget)]
                if args.model:
                    cmd += ["--model", args.model]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
                if proc.returncode != 0:
                    sys.exit(f"worker failed ({p}):\n{proc.stderr[-2000:]}")
                for t, shapes in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                    for n, ms in shapes.items():
                        results[(p, t)][int(n)] += ms
            print(f"# round {r + 1}/{args.rounds} done, {time.perf_counter() - t_start:.0f} s, "
                  f"load average {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    finally:
        if neighbour is not None:
            neighbour.terminate()
            neighbour.wait()
    print(f"{os.cpu_count()} CPUs; neighbour: {'busy loop pinned to CPU 0' if args.neighbour else 'none'}; "
          f"KV cache {args.cache}, position {args.pos}; load average {load0:.2f} -> {os.getloadavg()[0]:.2f}; "
          f"medians of {args.rounds} workers x up to {args.reps} reps\n")
    print("| wait policy | threads (1-row/batch) | 1 row ms | 2 rows ms | 5 rows ms | 2 rows / 1 row | 5 rows / 1 row |")
    print("|---|---|---|---|---|---|---|")
    for (p, t), shapes in results.items():
        med = {n: statistics.median(v) if v else float("nan") for n, v in shapes.items()}
        print(f"| {p} | {t} | {med[1]:.1f} | {med[2]:.1f} | {med[5]:.1f} | {med[2] / med[1]:.2f} | "
              f"{med[5] / med[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
