"""tools/bench/: its workloads, the report rendered from the bench's JSON (the one source of
every published speed figure), and one real run of the bench (ours and llama.cpp's server)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tools" / "bench"


@pytest.fixture
def bench_path(monkeypatch):
    """tools/bench on sys.path, as its scripts have it (they import each other by name)."""
    monkeypatch.syspath_prepend(str(BENCH))
    for name in [m for m in sys.modules if m == "workloads" or m.startswith("workloads.")
                 or m in ("report", "configs", "counts", "ours")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.fast
def test_no_round_asks_a_request_another_round_asked(bench_path):
    import workloads
    found = workloads.load()
    assert {w.kind for w in found} <= set(workloads.KINDS)
    assert {"input", "open", "replayed"} <= {w.kind for w in found}
    seen = {}
    for w in found:
        rounds = min(w.rounds, 8)
        asked = [tuple(w.instance(r).turns) for r in range(rounds)]
        if w.kind == "replayed":
            assert len(set(asked)) == 1 and asked[0] in seen, f"{w.name} replays nothing asked before"
            continue
        assert len(set(asked)) == rounds, f"{w.name} repeats a request"
        for a in asked:
            assert a not in seen, f"{w.name} asks what {seen.get(a)} asks"
            seen[a] = w.name
        with pytest.raises(ValueError, match="repeat"):
            w.instance(w.rounds)
    lengths = {w.name: w.tokens for w in found}
    assert lengths["short"] == 32 and lengths["long"] >= 512
    assert any(len(w.instance(0).turns) > 1 for w in found)        # an agent's later turn


@pytest.mark.fast
def test_the_committed_figures_render_to_the_committed_files(bench_path):
    """README's speed section, docs/benchmarks.md and its plot are what report.py renders
    from tools/bench/speed.json (`python tools/bench/report.py --write` after a bench run)."""
    import report
    data = json.loads(report.JSON.read_text(encoding="utf-8"))
    readme = report.README.read_text(encoding="utf-8")
    assert report.readme_section_of(readme) == report.readme_section(data)
    assert report.stale(data) == []


def _run(config, workload, r, n, secs, drafted, text, steps=0, same=None):
    x = {"config": config, "workload": workload, "round": r, "n": n, "decode_s": secs, "drafted": drafted,
         "accepted": drafted, "stop": "length", "text_sha": text}
    if steps:
        x["steps"] = steps
    if same is not None:
        x["same_tokens"] = same
    return x


def _figures(native_drafts=0, native_text="a", same=True):
    cfgs = [{"name": n} for n in ("ours plain", "ours ngram-mod", "native plain", "native ngram-mod")]
    runs = []
    for r in range(2):
        for wl in ("copy", "prose"):
            runs += [_run("ours plain", wl, r, 100, 1.0, 0, "a"),
                     _run("ours ngram-mod", wl, r, 100, 0.5 if wl == "copy" else 1.0, 40, "a", 60, same),
                     _run("native plain", wl, r, 100, 1.0, 0, native_text),
                     _run("native ngram-mod", wl, r, 100, 0.8, native_drafts, native_text)]
    return {"meta": {"when": "2026-12-01 10:00", "command": "python tools/bench/bench.py", "geniex": "abc",
                     "llama_cpp": "b11549", "model": "demo.gguf", "cpus": 2, "load_before": 0.1, "loads": [1.9],
                     "seconds": 600, "rounds": 2, "warnings": [], "row_cost": [[1.0, 2.0, 2.8, 4.1]]},
            "configs": cfgs,
            "workloads": [{"name": "copy", "kind": "input", "describe": "d", "tokens": 100},
                          {"name": "prose", "kind": "open", "describe": "d", "tokens": 100}],
            "runs": runs}


@pytest.mark.fast
def test_a_side_that_drafted_nothing_is_not_a_win(bench_path):
    import report
    data = _figures(native_drafts=0)
    fig = report.Figures(data)
    assert fig.ratio("ours ngram-mod", "native ngram-mod", "copy") == pytest.approx(1.6)
    assert fig.cell("ours ngram-mod", "native ngram-mod", "copy")[1] == report.NO_DRAFT
    assert fig.wins("ours ngram-mod", "native ngram-mod", ["copy", "prose"]) == []
    assert "| 1.60† |" in report.render_report(data)
    fig = report.Figures(_figures(native_drafts=5))
    assert fig.wins("ours ngram-mod", "native ngram-mod", ["copy", "prose"]) == ["copy"]


@pytest.mark.fast
def test_other_texts_and_differing_tokens_are_said(bench_path):
    import report
    data = _figures(native_drafts=5, native_text="b", same=False)
    text = report.render_report(data)
    assert "1.60" + report.OTHER_TEXT in text
    assert "**4 of 4 speculative answers differ from plain decoding:**" in text
    section = report.readme_section(data)
    assert "**4 of 4 speculative geniex answers differ from plain decoding.**" in section
    # The headline's geometric mean is over the workloads that do not repeat, per kind too.
    row = next(line for line in section.splitlines() if line.startswith("| geniex ngram-mod / geniex plain"))
    assert re.search(r"\| 1\.41 \| 2\.00 \| 1\.00 \| 1\.00 \(prose\) \|", row), row


@pytest.mark.fast
def test_the_bench_imports_from_tests_only_the_replay_target():
    """counts.py replays answers on tests/support/replay.py (which needs nothing of pytest);
    nothing else under tools/bench reaches into tests/."""
    support = "|".join(p.stem for p in (ROOT / "tests" / "support").glob("*.py") if p.stem != "replay")
    for path in BENCH.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        reach = [line for line in text.splitlines() if "sys.path" in line and "tests" in line]
        assert not reach or (path.name == "counts.py" and len(reach) == 1), path
        assert not re.search(rf"^\s*(from|import) ({support})\b", text, re.M), path


@pytest.mark.fast
def test_ours_is_counted_as_llama_cpp_counts_predicted_tokens(bench_path):
    """llama.cpp's server: n tokens over n - 1 decodes (its first from the prompt's batch),
    an end token counted. Ours' Stats: every token decoded on the clock, no end token."""
    import ours
    from geniex.engine.stats import Stats
    # 25 tokens and the end token, one decode each (the first step decoded the prompt's
    # last token and sampled the first), 10 ms a decode: counted as 26 over 25 decodes.
    st = Stats(decode_tokens=25, decode_time=0.26)
    st.stop_reason = "eos"
    assert ours.as_llama_counts(st, 0.01, 1) == (26, pytest.approx(0.25))
    st.stop_reason = "length"                   # stopped at max tokens: 25 over 24 decodes
    assert ours.as_llama_counts(st, 0.02, 1) == (25, pytest.approx(0.24))
    # A first step that accepted 3 drafts: only its first token counts.
    assert ours.as_llama_counts(st, 0.02, 4) == (22, pytest.approx(0.24))


def test_a_quick_bench_run_measures_both_sides(tmp_path, calibration_cache):
    """One round of one workload, 24-token answers: every configuration answers, ours'
    speculative answer drafted and equals plain decoding, and the report renders from the
    JSON it wrote. (The code-edit answer copies its prompt: ours drafts from its 7th token.
    Ours' draft policy starts from the suite's calibration: the curves measured once per run.)"""
    out = tmp_path / "speed.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench.py"), "--quick", "--rounds", "1",
                           "--workloads", "code-edit", "--tokens", "24", "--json", str(out),
                           "--calibration", str(calibration_cache)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    names = [c["name"] for c in data["configs"]]
    assert names == ["ours plain", "ours ngram-mod", "native plain", "native ngram-mod"]
    assert {(x["config"], x["workload"]) for x in data["runs"]} == {(c, "code-edit") for c in names}
    spec = [x for x in data["runs"] if "same_tokens" in x]
    assert spec and all(x["same_tokens"] for x in spec)
    assert all(x["drafted"] > 0 for x in spec)          # the identity check compared drafted steps
    assert all(0 < x["n"] <= 24 and x["decode_s"] > 0 for x in data["runs"])
    assert [w["tokens"] for w in data["workloads"]] == [24]
    # The curve ours' policy drafted by is reported, and it is the suite's, as given (a
    # curve measured in the run was checked against 1.0 here: a noisy measurement on a
    # busy machine found a 2-row verify at 0.83 one-row decodes and failed the test).
    curves = [v["costs"] for v in json.loads(calibration_cache.read_text()).values()
              if isinstance(v, dict) and "costs" in v]
    assert data["meta"]["policy_verify_cost"]["ours ngram-mod"] in curves
    assert "## Ratios" in proc.stdout and "geniex ngram-mod / geniex plain" in proc.stdout


def test_a_quick_clients_run_lists_both_servers(tmp_path, calibration_cache):
    """clients.py's cold scenario, quick (one ~340-token first turn per server, a few
    seconds): both servers answer, the table has both columns, the JSON both sides.
    geniex's load with slots reads the suite's calibration instead of measuring it."""
    out = tmp_path / "clients.json"
    proc = subprocess.run([sys.executable, str(BENCH / "clients.py"), "--quick", "--scenarios", "cold",
                           "--json", str(out), "--calibration", str(calibration_cache)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| | geniex | llama.cpp | geniex / llama.cpp |" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| TTFT s |"))
    assert re.match(r"\| TTFT s \| [\d.]+ \| [\d.]+ \| [\d.]+ ", row), row
    (cold,) = [x for x in json.loads(out.read_text())["rounds"]]
    assert {side: cold[side]["cold"]["prompt tokens"] > 300 for side in ("geniex", "llama.cpp")} == \
        {"geniex": True, "llama.cpp": True}
