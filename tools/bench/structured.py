#!/usr/bin/env python3
"""Schema-constrained decoding with forced-token drafts vs free decoding of the same
length, in one run, on one loaded model.

    python tools/bench/structured.py [--model PATH] [--rounds 3] [--tokens 200] [--spec-type ngram-mod] [--threads N]

Each round answers three JSON-schema requests (a list of people, an order, an inventory)
three ways, interleaved so that a busy machine slows all three alike:

- ``forced``: constrained, speculative (the grammar's forced tokens drafted, with
  ``--spec-type``'s drafter after them when one is given);
- ``constrained``: constrained, plain (no drafts at all);
- ``free``: unconstrained with the end token banned, exactly as many tokens as the
  constrained answer had (the same prompt), plain.

Printed: decode tokens/s of each (sum of tokens over sum of decode time), the ratios
forced/free and forced/constrained, the forced drafter's acceptance (accepted / drafted
tokens, and per method), target decodes per answer token, and whether the forced answer
equals the plain constrained one (it must). The machine's load average is printed with
the figures; no figure here is published anywhere else.
"""
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PEOPLE = {"type": "array", "minItems": 4, "maxItems": 4, "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "age", "city", "email"],
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"},
                   "city": {"type": "string", "maxLength": 16}, "email": {"type": "string", "maxLength": 32}}}}
ORDER = {"type": "object", "additionalProperties": False, "required": ["order_id", "customer", "items", "status"],
         "properties": {"order_id": {"type": "integer"}, "customer": {"type": "object", "additionalProperties": False,
                                                                     "required": ["first_name", "last_name", "address"],
                                                                     "properties": {"first_name": {"type": "string", "maxLength": 12},
                                                                                    "last_name": {"type": "string", "maxLength": 12},
                                                                                    "address": {"type": "string", "maxLength": 40}}},
                        "items": {"type": "array", "minItems": 3, "maxItems": 3,
                                  "items": {"type": "object", "additionalProperties": False,
                                            "required": ["product", "quantity", "unit_price"],
                                            "properties": {"product": {"type": "string", "maxLength": 20},
                                                           "quantity": {"type": "integer"},
                                                           "unit_price": {"type": "number"}}}},
                        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]}}}
INVENTORY = {"type": "array", "minItems": 5, "maxItems": 5, "items": {
    "type": "object", "additionalProperties": False, "required": ["sku", "colour", "weight_kg", "in_stock"],
    "properties": {"sku": {"type": "string", "maxLength": 10}, "colour": {"enum": ["red", "green", "blue", "black"]},
                   "weight_kg": {"type": "integer"}, "in_stock": {"type": "boolean"}}}}
REQUESTS = [("people", "List four people with their name, age, city and email, as JSON.", PEOPLE),
            ("order", "Write an example shop order with three items, as JSON.", ORDER),
            ("inventory", "Describe five warehouse items, as JSON.", INVENTORY)]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: the bundled demo model)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200, help="answer length limit")
    ap.add_argument("--spec-type", default="", help="a drafter to combine with the forced drafts")
    ap.add_argument("--threads", type=int, default=0, help="threads for decodes and batches (0: every physical core)")
    args = ap.parse_args(argv)

    from geniex.engine.chat import template_for
    from geniex.engine.constraints import Grammar
    from geniex.engine.loop import GenOptions
    from geniex.engine.sampling import SamplingParams
    from geniex.engine.session import LoadOptions, Session
    from geniex.speculative.options import SpecOptions
    from geniex.store import demo_model_path

    spec = SpecOptions(types=(args.spec_type,), policy="fixed") if args.spec_type else SpecOptions()
    session = Session(args.model or demo_model_path(), LoadOptions(nctx=2048, threads=args.threads,
                                                                threads_batch=args.threads, spec=spec))
    render = template_for(session.model).render
    prompts = [(name, session.tokenize_prompt(render([{"role": "user", "content": text}])),
                Grammar.parse("json_schema", schema)) for name, text, schema in REQUESTS]
    greedy = SamplingParams(seed=1)
    totals = {k: [0, 0.0] for k in ("forced", "constrained", "free")}
    drafted = accepted = steps = 0
    by_method = {}
    identical = True
    load_before = os.getloadavg()

    def run(tokens, opts, speculative):
        session.reset(drafts=True)
        gen = session.generate(tokens, opts, speculative=speculative)
        gen.run()
        return gen

    for r in range(args.rounds):
        for name, tokens, grammar in prompts:
            opts = GenOptions(max_tokens=args.tokens, grammar=grammar, sampling=greedy)
            forced = run(tokens, opts, True)
            plain = run(tokens, opts, False)
            n = len(plain.tokens)
            free = run(tokens, GenOptions(max_tokens=n, sampling=SamplingParams(seed=1,
                                                                                logit_bias=tuple((t, float("-inf")) for t in session.vocab.eog))),
                       False)
            identical &= forced.tokens == plain.tokens
            for key, gen in (("forced", forced), ("constrained", plain), ("free", free)):
                totals[key][0] += gen.stats.decode_tokens
                totals[key][1] += gen.stats.decode_time
            drafted += forced.stats.drafted
            accepted += forced.stats.accepted
            steps += forced.stats.steps
            for method, counts in forced.stats.by_method.items():
                m = by_method.setdefault(method, [0, 0])
                m[0] += counts[1]
                m[1] += counts[2]
            print(f"round {r + 1} {name}: {n} tokens, stop {plain.stats.stop_reason}; forced "
                  f"{forced.stats.decode_tokens / forced.stats.decode_time:.1f} tok/s, constrained "
                  f"{plain.stats.decode_tokens / plain.stats.decode_time:.1f}, free "
                  f"{free.stats.decode_tokens / free.stats.decode_time:.1f}; drafted {forced.stats.drafted}, "
                  f"accepted {forced.stats.accepted}", flush=True)

    speed = {k: v[0] / v[1] for k, v in totals.items()}
    print()
    print(f"model {Path(session.model.path).name}, threads {session.threads}/{session.threads_batch}, "
          f"drafter: forced{'+' + args.spec_type if args.spec_type else ''}")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} (1 min)")
    for k in ("forced", "constrained", "free"):
        print(f"{k:12s} {totals[k][0]:6d} tokens  {speed[k]:7.1f} tok/s")
    print(f"forced / free        {speed['forced'] / speed['free']:.2f}x")
    print(f"forced / constrained {speed['forced'] / speed['constrained']:.2f}x")
    print(f"constrained / free   {speed['constrained'] / speed['free']:.2f}x")
    print(f"forced drafts: {accepted}/{drafted} accepted ({accepted / max(drafted, 1):.1%}); "
          f"{steps / max(totals['forced'][0], 1):.2f} target decodes per answer token")
    for method, (d, a) in sorted(by_method.items()):
        print(f"  {method:24s} {a}/{d} accepted ({a / max(d, 1):.1%})")
    print(f"forced answers equal plain constrained answers: {identical}")
    session.close()
    return 0 if identical else 1


if __name__ == "__main__":
    t0 = time.time()
    code = main()
    print(f"({time.time() - t0:.0f} s)")
    sys.exit(code)
