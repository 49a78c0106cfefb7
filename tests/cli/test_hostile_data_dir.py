"""A tampered data dir seen through the CLI with a real (tiny) model loaded."""
import json
import os

import pytest
import tiny_gemma4


@pytest.mark.uncalibrated
def test_a_fifo_calibration_cache_does_not_hang_a_speculative_load(cli, data_dir, tmp_path):
    # Any model calibrates on a first speculative load; a tiny one measures its curves in
    # milliseconds (the demo model's two curves took most of this test's time).
    model = tiny_gemma4.write_llama(tmp_path / "tiny-llama.gguf")
    fifo = data_dir / "calibration.json"
    os.mkfifo(fifo)
    proc = cli("infer", model, "-p", "Count from one to five.", "--spec-type", "ngram-simple", "--max-tokens", "8",
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert fifo.is_file() and json.loads(fifo.read_text())   # calibrated; the FIFO replaced by the cache
