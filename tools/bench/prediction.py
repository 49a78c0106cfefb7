#!/usr/bin/env python3
"""Predicted outputs on code edits: the answer's decode speed with OpenAI's ``prediction``
(the code being edited) against plain decoding and ngram-mod, in one run.

    python tools/bench/prediction.py [--rounds 2] [--max-tokens 400]

Each code edit of the bench's ``code-edit`` workload is answered by the demo model four
ways: plain; plain with the code as the prediction; ngram-mod (memory forgotten before
each answer, so only the prompt is there to copy: work that does not repeat); ngram-mod
with the prediction. Every answer must be the plain answer's tokens (checked). Printed:
decode tokens/s per way (median over edits and rounds) and the ratios to plain, with the
draft tokens accepted. A busy machine makes the figures doubtful: the load average is
printed before and after.
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from geniex.engine.chat import Conversation  # noqa: E402
from geniex.engine.loop import GenOptions  # noqa: E402
from geniex.engine.sampling import SamplingParams  # noqa: E402
from geniex.engine.session import LoadOptions, Session  # noqa: E402
from geniex.speculative.options import SpecOptions  # noqa: E402
from geniex.store.demo import INSTALL_HINT, demo_model_path  # noqa: E402
from workloads.code_edit import ASK, FUNCTIONS  # noqa: E402


def answer(session, prompt, max_tokens, prediction=None):
    session.reset(drafts=True)
    gen = Conversation(session).ask(prompt, GenOptions(max_tokens=max_tokens, sampling=SamplingParams(),
                                                       prediction=prediction))
    for _ in gen:
        pass
    return gen.tokens, gen.stats


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=400)
    args = p.parse_args(argv)
    path = demo_model_path()
    if path is None:
        raise SystemExit(f"the demo model is not installed: {INSTALL_HINT}")
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    plain = Session(path, LoadOptions(nctx=2048))
    ngram = Session(path, LoadOptions(nctx=2048, spec=SpecOptions(types=("ngram-mod",))))
    ways = {"plain": (plain, False), "plain + prediction": (plain, True),
            "ngram-mod": (ngram, False), "ngram-mod + prediction": (ngram, True)}
    speed = {w: [] for w in ways}
    accepted = {w: 0 for w in ways}
    try:
        for _ in range(args.rounds):
            for edit, code in FUNCTIONS:
                prompt = ASK.format(edit=edit, code=code)
                want = None
                for way, (session, predicted) in ways.items():
                    tokens, stats = answer(session, prompt, args.max_tokens,
                                           f"```python\n{code}```" if predicted else None)
                    want = tokens if want is None else want
                    if tokens != want:
                        raise SystemExit(f"{way}: the answer differs from plain decoding (a bug: report it)")
                    speed[way].append(stats.decode_speed)
                    accepted[way] += stats.accepted
    finally:
        ngram.close()
        plain.close()
    base = statistics.median(speed["plain"])
    print(f"{'way':<24} {'tok/s':>7} {'x plain':>8} {'accepted':>9}")
    for way, values in speed.items():
        med = statistics.median(values)
        print(f"{way:<24} {med:7.1f} {med / base:8.2f} {accepted[way]:9d}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
