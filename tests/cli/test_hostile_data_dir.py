"""A tampered data dir seen through the CLI with the real model loaded."""
import json
import os

import pytest


@pytest.mark.uncalibrated
def test_a_fifo_calibration_cache_does_not_hang_a_speculative_load(cli, data_dir):
    fifo = data_dir / "calibration.json"
    os.mkfifo(fifo)
    proc = cli("infer", "-p", "Count from one to five.", "--spec-type", "ngram-simple", "--max-tokens", "8",
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert fifo.is_file() and json.loads(fifo.read_text())   # calibrated; the FIFO replaced by the cache
