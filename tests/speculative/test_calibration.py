"""The draft policy's verify cost curve, measured on a model when it loads.

Measuring is the same code on any model; the tiny generated Gemma-4 target
(tests/support/tiny_gemma4.py) measures in milliseconds where the demo model takes
seconds per curve. The demo model is loaded where its own curves are the point (the
suite's calibration cache)."""
import json
from pathlib import Path

import pytest

from geniex.engine.session import LoadOptions, Session
from geniex.speculative import policy
from geniex.speculative.options import SpecOptions


def test_calibration_measures_every_size_and_leaves_the_context_empty(tiny, tmp_path):
    # A plain session: its load measures nothing, so the curve below is this call's.
    s = Session(tiny["pair"][0], LoadOptions(nctx=512, threads=1, threads_batch=1, data_dir=tmp_path))
    try:
        costs, one = policy.calibrate(s.ctx, s.batch, 1, repeats=2)
        assert sorted(costs) == list(policy.ROWS)
        assert costs[1] == 1.0 and one > 0
        assert all(c > 0 for c in costs.values())
        # Nothing left in the KV cache: a token at position 0 decodes (llama.cpp refuses a
        # batch whose positions do not follow the cached ones).
        s.ctx.decode(s.batch.fill([1], 0))
    finally:
        s.close()


def test_a_curve_cached_by_the_old_measurement_is_measured_again(tiny, tmp_path):
    """Curves cached before the sizes took turns (each size's decodes in one burst: a
    neighbour's burst could fall on the one-row decodes alone) are not used."""
    model = tiny["pair"][0]
    st = Path(model).stat()
    old_key = f"{Path(model).resolve()}|{st.st_size}|{int(st.st_mtime)}|1/1|q8_0/q8_0"
    absurd = {"1": 1.0, "2": 40.0, "4": 41.0, "8": 42.0, "16": 43.0}
    (tmp_path / "calibration.json").write_text(json.dumps({old_key: {"costs": absurd, "one_row": 0.01}}))
    s = Session(model, LoadOptions(nctx=512, threads=1, threads_batch=1, data_dir=tmp_path,
                                   adaptive_threads=False, spec=SpecOptions(types=("ngram-mod",))))
    try:
        # Not the cached curve (compared as measured: ``costs`` is made plausible, which
        # would clamp the absurd 40 to 2).
        assert s.policy.measured != {int(r): c for r, c in absurd.items()} and s.policy.one_row != 0.01
        cached = json.loads((tmp_path / "calibration.json").read_text())
        assert any(k.endswith(f"|{policy.CALIBRATION}") for k in cached)
    finally:
        s.close()


def test_a_curve_measured_during_stalls_is_measured_again(tmp_path):
    """A cached curve marked as measured during stalls (a batch far above its rows decoded
    one at a time) is not used: the next load measures again."""
    cache = policy.CalibrationCache(tmp_path / "calibration.json")
    cache.put("k", ({1: 1.0, 2: 9.0}, 0.01), stalled=True)
    assert cache.get("k") is None
    cache.put("k", ({1: 1.0, 2: 1.9}, 0.01))
    assert cache.get("k") == ({1: 1.0, 2: 1.9}, 0.01)


def test_the_suites_data_dir_holds_the_curves_a_demo_model_load_looks_up(demo_model, data_dir):
    """The data_dir fixture starts with the suite's calibration cache (measured once per
    run, tests/support/shared_fixtures.py): a speculative load of the demo model finds its
    curves there and measures nothing again (a measured curve would replace the entry)."""
    path = data_dir / "calibration.json"
    st = Path(demo_model).stat()
    prefix = f"{Path(demo_model).resolve()}|{st.st_size}|{int(st.st_mtime)}|"
    before = {k: v for k, v in json.loads(path.read_text()).items() if k.startswith(prefix)}
    assert before and not any(v.get("stalled") for v in before.values()), before
    s = Session(demo_model, LoadOptions(nctx=256, data_dir=data_dir, spec=SpecOptions(types=("ngram-simple",))))
    try:
        assert s.policy.name == "auto"
    finally:
        s.close()
    after = json.loads(path.read_text())
    assert {k: after[k] for k in before} == before


@pytest.mark.uncalibrated
def test_a_first_speculative_load_calibrates_into_an_empty_data_dir(tiny, data_dir):
    """Tests marked uncalibrated start from an empty data dir, as a user's first run: the
    load measures the curve and caches it under the model's key."""
    model = tiny["pair"][0]
    assert list(data_dir.iterdir()) == []
    s = Session(model, LoadOptions(nctx=256, data_dir=data_dir, spec=SpecOptions(types=("ngram-simple",))))
    s.close()
    st = Path(model).stat()
    prefix = f"{Path(model).resolve()}|{st.st_size}|{int(st.st_mtime)}|"
    assert any(k.startswith(prefix) for k in json.loads((data_dir / "calibration.json").read_text()))
