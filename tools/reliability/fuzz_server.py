"""Fuzz a real ``geniex serve`` from its own OpenAPI document with schemathesis.

Starts the server on a free loopback port (never anything else) with a throw-away
data dir, runs ``st run <server>/openapi.json`` against it for a bounded number of
generated requests, then checks that the server is still alive and answering.
Prints the figures the README's "Reliability" section quotes: requests sent, inputs
tried, failures by check, 5xx answers, and whether the process survived.

    pip install -e '.[reliability]'        # or: pip install schemathesis
    python tools/reliability/fuzz_server.py --max-examples 700 --seed 12

``--max-examples`` is per operation and phase; with ``--max-time`` schemathesis
repeats its fuzzing and stateful phases until the time is spent (the README's run:
``--max-examples 5 --max-time 900``, about 11,000 requests). Generated bodies name
models that do not exist (a 404 after parsing and validation), so the run exercises
parsing, validation, routing and the guards, not generation: the regression tests
in ``tests/*/test_hardening_*.py`` cover requests that reach the model.
"""
import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_server import start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def count_report(path):
    """Requests, distinct inputs and failures from schemathesis's ndjson event log."""
    requests_sent, statuses, failures, inputs = 0, collections.Counter(), collections.Counter(), set()
    for line in path.read_text().splitlines():
        event = json.loads(line)
        for kind, body in event.items():
            if kind != "ScenarioFinished":
                continue
            recorder = body.get("recorder") or {}
            for interaction in (recorder.get("interactions") or {}).values():
                response = interaction.get("response") or {}
                req = interaction.get("request") or {}
                requests_sent += 1
                statuses[response.get("status_code")] += 1
                inputs.add(json.dumps([req.get("method"), req.get("uri"), req.get("headers"), req.get("body")],
                                      sort_keys=True, default=str))
            for check_list in (recorder.get("checks") or {}).values():
                for check in check_list:
                    if check.get("status") == "failure":
                        failures[check.get("name")] += 1
    return requests_sent, len(inputs), statuses, failures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-examples", type=int, default=100, help="per operation and phase (default 100)")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--checks", default=CHECKS)
    ap.add_argument("--max-time", type=int, default=None,
                    help="seconds to keep fuzzing (repeats the phases; default: each phase once)")
    ap.add_argument("--report-dir", default=None, help="keep schemathesis's reports here")
    ap.add_argument("server_args", nargs="*", help="extra `geniex serve` flags (after --)")
    args = ap.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="geniex-fuzz-"))
    report_dir = Path(args.report_dir or data / "report")
    proc, url = start_server(data, args.server_args, 512)
    print(f"server {url} (log: {data / 'server.log'})", flush=True)
    t0 = time.monotonic()
    try:
        cmd = ["st", "run", f"{url}/openapi.json", "--checks", args.checks, "--max-examples",
               str(args.max_examples), "--seed", str(args.seed), "--workers", str(args.workers),
               *(["--max-time", str(args.max_time)] if args.max_time else []), "--request-timeout", "300", "--suppress-health-check", "all",
               "--generation-database", "none", "--continue-on-failure", "--no-color", "--report", "ndjson",
               "--report-dir", str(report_dir)]
        print(" ".join(cmd), flush=True)
        fuzz = subprocess.run(cmd, cwd=ROOT)
        alive = proc.poll() is None
        health = requests.get(url + "/health", timeout=30).status_code if alive else None
    finally:
        proc.terminate()
        proc.wait(60)
    elapsed = time.monotonic() - t0
    sent, inputs, statuses, failures = count_report(next(report_dir.glob("*.ndjson")))
    server_errors = sum(n for status, n in statuses.items() if status and status >= 500)
    log_text = (data / "server.log").read_text()
    print(f"\nrequests {sent}, distinct inputs {inputs}, in {elapsed:.0f} s")
    print("statuses: " + ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items(), key=lambda x: str(x[0]))))
    print("failed checks: " + (", ".join(f"{k}: {v}" for k, v in failures.items()) or "none"))
    print(f"5xx answers: {server_errors}; tracebacks in the server log: {log_text.count('Traceback')}; "
          f"server alive at the end: {alive} (/health {health}); schemathesis exit {fuzz.returncode}")
    return 0 if alive and not server_errors and "Traceback" not in log_text else 1


if __name__ == "__main__":
    sys.exit(main())
