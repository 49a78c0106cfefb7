"""A bench worker: one configuration (ours or native) loaded once in its own process.

Every configuration, ours and native alike, runs in a worker, so the scheduler treats
both sides the same (a loop in the bench's own process looked slower than the same
library call in a worker: BENCHMARKS.md, "How to read the numbers"). The bench talks to
it in JSON lines on stdin/stdout: ``{"cmd": ...}`` in, one JSON answer out.

    python tools/bench/worker.py CONFIG_JSON MODEL_PATH        (started by the bench)
"""
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def serve(cfg_json, model_path):
    sys.path.insert(0, str(ROOT))
    from configs import Config
    cfg = Config.from_json(json.loads(cfg_json))
    if cfg.side == "native":
        from native import Runner
    else:
        from ours import Runner
    runner = Runner(cfg, model_path)
    print(json.dumps({"ready": True, **runner.hello}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req.pop("cmd")
        print(json.dumps(getattr(runner, cmd)(**req)), flush=True)


class Worker:
    """The bench's handle on one configuration's worker process."""

    def __init__(self, cfg, model_path, logdir):
        self.cfg = cfg
        self.log = open(Path(logdir) / (cfg.name.replace(" ", "_").replace("=", "eq") + ".log"), "a")
        # The run's own data dir: the draft policy's verify costs are measured afresh in
        # this run's conditions, never read from (or left in) the user's calibration cache
        # (bench.py --calibration starts it from a copy of a given one instead).
        env = dict(os.environ, GGML_NO_BACKTRACE="1", GENIEX_DATADIR=str(Path(logdir) / "data"))
        self.proc = subprocess.Popen([sys.executable, str(HERE / "worker.py"), json.dumps(cfg.to_json()),
                                      str(model_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, cwd=str(ROOT))
        self.hello = {}

    def wait_ready(self):
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.cfg.name}: the worker did not start (see {self.log.name})")
        self.hello = json.loads(line)

    def ask(self, cmd, **req):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **req}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.cfg.name}: the worker died (see {self.log.name})")
        return json.loads(line)

    def close(self):
        """End the worker: closing its stdin ends its loop; kill it if it does not go."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.log.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
