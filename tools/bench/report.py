#!/usr/bin/env python3
"""Every published speed figure, rendered from one file: the bench's JSON.

    python tools/bench/report.py [--json tools/bench/speed.json] [--write | --check]

From ``tools/bench/speed.json`` (written by ``bench.py --publish``) this renders the bench
report (:data:`REPORT`), its plot (:data:`PLOT`, SVG) and the README's speed table (between
:data:`BEGIN` and :data:`END` in README.md). ``--write`` writes all three; ``--check``
says whether the committed files equal what it renders (a test runs the same check).

Ratios are of decode speed (answer tokens / decode time), measured in one run: per
workload the median over rounds of the per-round ratio (both sides answered the same
request minutes apart at most), and their geometric mean over workloads.
"""
import argparse
import html
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
JSON = HERE / "speed.json"
REPORT = ROOT / "docs" / "benchmarks.md"
PLOT = ROOT / "docs" / "benchmarks.svg"
README = ROOT / "README.md"
BEGIN = "<!-- speed:begin -->"
END = "<!-- speed:end -->"

# The rows of the headline: (numerator, denominator, what they compare).
RATIOS = [
    ("ours ngram-mod", "native ngram-mod", "geniex ngram-mod / llama.cpp server ngram-mod, each at its defaults, "
                                           "state kept"),
    ("ours ngram-mod", "ours plain", "geniex ngram-mod / geniex plain"),
    ("ours plain", "native plain", "geniex plain / llama.cpp server plain, each at its defaults"),
    ("ours plain", "native plain =", "geniex plain / llama.cpp server plain, equal settings"),
    ("ours ngram-mod", "native ngram-mod =", "geniex ngram-mod / llama.cpp server ngram-mod, equal settings "
                                             "and n-gram parameters"),
    ("ours ngram-mod fresh", "ours plain", "geniex ngram-mod without memory across requests / geniex plain"),
    ("native ngram-mod", "native plain", "llama.cpp server ngram-mod / its plain, each at its defaults"),
    # bench.py --load N only: ours at its defaults must keep >= 0.9x of one thread beside a busy neighbour.
    ("ours plain", "ours plain 1 thread", "geniex plain at its defaults / geniex plain on one thread (busy "
                                          "neighbour: --load)"),
]
NO_DRAFT = "†"
OTHER_TEXT = "‡"
KIND_TITLE = {"input": "input-grounded", "open": "open", "replayed": "replayed"}


class Figures:
    """The JSON of one bench run, with the figures every output reads."""

    def __init__(self, data):
        self.data = data
        self.meta = data["meta"]
        self.configs = [c["name"] for c in data["configs"]]
        self.workloads = data["workloads"]
        self.kind = {w["name"]: w["kind"] for w in self.workloads}
        self.runs = {}
        for x in data["runs"]:
            self.runs.setdefault((x["config"], x["workload"]), {})[x["round"]] = x

    def has(self, cfg):
        return cfg in self.configs

    def names(self, kinds):
        return [w["name"] for w in self.workloads if w["kind"] in kinds]

    def speed(self, cfg, wl, r):
        x = self.runs[(cfg, wl)][r]
        return x["n"] / x["decode_s"] if x["decode_s"] > 0 else float("nan")

    def median_speed(self, cfg, wl):
        return _median([self.speed(cfg, wl, r) for r in self.runs[(cfg, wl)]])

    def ratio(self, a, b, wl):
        """Median over rounds of the per-round speed ratio a / b on workload ``wl``."""
        rounds = sorted(set(self.runs[(a, wl)]) & set(self.runs[(b, wl)]))
        return _median([self.speed(a, wl, r) / self.speed(b, wl, r) for r in rounds])

    def total(self, cfg, wl, key):
        return sum(x.get(key, 0) for x in self.runs[(cfg, wl)].values())

    def drafted_nothing(self, cfg, wl):
        """Whether a speculative configuration drafted nothing on this workload (None: plain)."""
        if not _speculative(cfg):
            return None
        return self.total(cfg, wl, "drafted") == 0

    def same_text(self, a, b, wl):
        ra, rb = self.runs[(a, wl)], self.runs[(b, wl)]
        return all(ra[r]["text_sha"] == rb[r]["text_sha"] for r in set(ra) & set(rb))

    def cell(self, a, b, wl):
        """The ratio with its marks: † one side drafted nothing (not a win), ‡ other texts."""
        value = self.ratio(a, b, wl)
        marks = ""
        if self.drafted_nothing(a, wl) or self.drafted_nothing(b, wl):
            marks += NO_DRAFT
        if not self.same_text(a, b, wl):
            marks += OTHER_TEXT
        return value, marks

    def geo(self, a, b, names):
        vals = [self.ratio(a, b, wl) for wl in names]
        return geo_mean(vals)

    def wins(self, a, b, names):
        """Workloads where a is ahead of b and both drafted (a row where one side drafted
        nothing is not a win of one drafter over the other)."""
        return [wl for wl in names if self.ratio(a, b, wl) > 1.0
                and not self.drafted_nothing(a, wl) and not self.drafted_nothing(b, wl)]

    def identity(self):
        """(runs checked, runs whose tokens differ from ours plain's)."""
        checked = [x for x in self.data["runs"] if "same_tokens" in x]
        return len(checked), [x for x in checked if not x["same_tokens"]]


def _speculative(cfg):
    return "plain" not in cfg


def _median(xs):
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def geo_mean(xs):
    xs = [x for x in xs if x == x]
    if not xs or min(xs) <= 0:
        return float("nan")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def f2(x):
    return "-" if x != x else f"{x:.2f}"


def f1(x):
    return "-" if x != x else f"{x:.1f}"


def pct(a, b):
    return f"{a / b:.0%}" if b else "-"


def table(headers, rows):
    out = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(out)


def conditions(fig):
    """One sentence: when, where, how loaded, how long."""
    m = fig.meta
    loads = m["loads"]
    during = f"{min(loads):.2f}-{max(loads):.2f}" if loads else "-"
    return (f"{m['when']}, `{m['command']}`, geniex {m['geniex'] or '?'}, llama.cpp {m['llama_cpp']}; "
            f"{m['model']}, greedy; {m['cpus']} CPUs, load average {m['load_before']:.2f} before the run "
            f"and {during} after each round; {m['rounds']} round{'s' if m['rounds'] != 1 else ''}, "
            f"{m['seconds'] // 60} min")


def _groups(fig):
    """(column title, workload names) of the headline's geometric means."""
    fresh = fig.names(("input", "open"))
    return [("work that does not repeat", fresh), ("input-grounded", fig.names(("input",))),
            ("open", fig.names(("open",))), ("replayed", fig.names(("replayed",)))]


def readme_section(data):
    """The README's speed table (the text between BEGIN and END)."""
    fig = Figures(data)
    groups = [(t, names) for t, names in _groups(fig) if names]
    rows = []
    for a, b, label in RATIOS:
        if not (fig.has(a) and fig.has(b)):
            continue
        fresh = groups[0][1]
        low = min(fresh, key=lambda wl: fig.ratio(a, b, wl))
        cells = [f2(fig.geo(a, b, names)) for _t, names in groups]
        rows.append([label] + cells + [f"{f2(fig.ratio(a, b, low))} ({low})"])
    headers = ["geometric mean of per-workload ratios"] + [t for t, _ in groups] + ["lowest workload"]
    checked, differ = fig.identity()
    lines = []
    if fig.meta["warnings"]:
        lines += ["**These figures come from a run on a busy machine (warnings below): they say more about "
                  "the load than about either side. Take them again on a quiet machine "
                  "(`python tools/bench/bench.py --publish`).**", ""]
    lines += [
        "Decode speed ratios measured in one run of `tools/bench/bench.py` (" + conditions(fig) + "):",
        "",
        table(headers, rows),
        "",
        "Each round asks every workload a request no round asked before (another function to edit, "
        "passage to quote, table to convert, question, agent session, short or long answer); `replayed` "
        "asks the same request every round and is not part of the other columns. The workloads, "
        f"per-workload figures, drafting counts and the plot: [docs/benchmarks.md]({_rel(REPORT)}).",
        "",
        (f"All {checked} speculative geniex answers equal plain decoding token for token." if not differ else
         f"**{len(differ)} of {checked} speculative geniex answers differ from plain decoding.**"),
    ]
    for w in fig.meta["warnings"]:
        lines += ["", f"Warning from the run: {w}."]
    return "\n".join(lines) + "\n"


def render_report(data):
    """The full report (markdown)."""
    fig = Figures(data)
    names = [w["name"] for w in fig.workloads]
    groups = [(t, ns) for t, ns in _groups(fig) if ns]
    out = ["# Benchmarks: decode speed on work that does not repeat itself", "",
           "Generated by `tools/bench/report.py` from `tools/bench/speed.json`; do not edit by hand "
           "(rerun `python tools/bench/bench.py --publish`). How the bench works and how to read it: "
           "`tools/bench/BENCHMARKS.md`.", "", conditions(fig) + ".", ""]
    if fig.meta["warnings"]:
        out += ["**This run was taken on a busy machine: its timings say more about the load than about "
                "either side.**", ""]
    for w in fig.meta["warnings"]:
        out += [f"**Warning:** {w}.", ""]

    out += ["## Workloads", "", table(["workload", "kind", "answer tokens (cap)", "each round"],
                                       [[w["name"], KIND_TITLE[w["kind"]], w["tokens"], w["describe"]]
                                        for w in fig.workloads]), ""]

    out += ["## Ratios", "",
            "Per workload: the median over rounds of the per-round ratio of decode speeds. "
            f"{NO_DRAFT} one side drafted nothing on that workload (the ratio compares drafting with plain "
            f"decoding, not two drafters: not counted as a win). {OTHER_TEXT} the two sides' answers are "
            "different texts (llama.cpp at its defaults uses an F16 KV cache, so its greedy answers "
            "differ from ours where two tokens are near-ties).", ""]
    rows = []
    for a, b, label in RATIOS:
        if fig.has(a) and fig.has(b):
            cells = []
            for wl in names:
                v, marks = fig.cell(a, b, wl)
                cells.append(f2(v) + marks)
            geos = [f2(fig.geo(a, b, ns)) for _t, ns in groups]
            wins = fig.wins(a, b, groups[0][1]) if _speculative(a) and _speculative(b) else None
            rows.append([label] + cells + geos + ["-" if wins is None else f"{len(wins)}/{len(groups[0][1])}"])
    out += [table(["ratio"] + names + [f"geo: {t}" for t, _ in groups] + ["wins, both drafting"], rows), ""]

    out += ["## Decode speed (tok/s, median over rounds)", "",
            "Absolute speeds move with the machine's load; read the ratios.", ""]
    rows = [[c] + [f1(fig.median_speed(c, wl)) for wl in names] for c in fig.configs]
    out += [table(["configuration"] + names, rows), "", "![tok/s by workload and configuration](benchmarks.svg)",
            ""]

    out += ["## Drafting", "",
            "Draft tokens verified and accepted, summed over rounds; steps = target decodes (ours only; "
            "native reports drafted and accepted only).", ""]
    rows = []
    for c in fig.configs:
        if not _speculative(c):
            continue
        for wl in names:
            d, acc = fig.total(c, wl, "drafted"), fig.total(c, wl, "accepted")
            n, steps = fig.total(c, wl, "n"), fig.total(c, wl, "steps")
            rows.append([c, wl, d, pct(acc, d), f2(steps / n) if steps and n else "-"])
    out += [table(["configuration", "workload", "drafted", "accepted", "target decodes per answer token"], rows), ""]

    detail = _counts(fig, names)
    if detail:
        out += ["## Where ours' drafts come from (ours ngram-mod, per step)", "",
                "Acceptance by position in the answer (tokens 0-15, 16-63, 64 and on), and the lengths "
                "the policy verified.", "", detail, ""]

    out += ["## Identity", ""]
    checked, differ = fig.identity()
    if differ:
        out.append(f"**{len(differ)} of {checked} speculative answers differ from plain decoding:** " +
                   ", ".join(f"{x['config']} on {x['workload']} round {x['round'] + 1}" for x in differ))
    else:
        out.append(f"All {checked} speculative answers of ours (every configuration, workload and round) "
                   "have exactly the token ids of ours' plain answer.")
    rows = []
    for c in fig.configs:
        if c.startswith("native"):
            rows.append([c] + [("same text" if fig.same_text(c, "ours plain", wl) else "other text")
                               for wl in names])
    if rows:
        out += ["", "llama.cpp's answers against ours' plain answers (its server returns text):", "",
                table(["configuration"] + names, rows)]
    costs = fig.meta.get("row_cost") or []
    if costs:
        rows = [[f"round {i + 1}, plain worker"] + [f2(c[j] / c[0]) for j in (1, 2, 3)] + ["-"]
                for i, c in enumerate(costs)]
        for name, curve in (fig.meta.get("policy_verify_cost") or {}).items():
            rows.append([f"{name}: its draft policy, at load"] + [f2(curve[k]) for k in ("2", "4", "8", "16")])
        out += ["", "## Verify-batch check", "",
                "A decode of k rows (logits on every row) in one-row decodes: measured once per round in the "
                "plain worker, and by each of ours' speculative configurations when it loaded (as measured: its "
                "draft policy sizes drafts by this curve, clamped to what a batch can cost). A 2-row batch far "
                "above its usual cost means stalled threads (a busy machine).", "",
                table(["measured", "2 rows", "4 rows", "8 rows", "16 rows"], rows)]
    return "\n".join(out) + "\n"


def _counts(fig, names):
    cfg = "ours ngram-mod"
    if not fig.has(cfg):
        return ""
    rows = []
    for wl in names:
        steps = [s for x in fig.runs[(cfg, wl)].values() for s in x.get("detail", [])]
        if not steps and fig.total(cfg, wl, "steps") == 0:
            continue
        buckets = []
        for lo, hi in ((0, 16), (16, 64), (64, 1 << 30)):
            sel = [s for s in steps if lo <= s[0] < hi]
            buckets.append(pct(sum(s[2] for s in sel), sum(s[1] for s in sel)) if sel else "-")
        lengths = {}
        for s in steps:
            lengths[s[1]] = lengths.get(s[1], 0) + 1
        n, total = fig.total(cfg, wl, "n"), fig.total(cfg, wl, "steps")
        rows.append([wl, f2(total / n) if n else "-", f2(sum(s[1] + 1 for s in steps) / len(steps)) if steps else "-",
                     *buckets, " ".join(f"{k}:{v}" for k, v in sorted(lengths.items())) or "-"])
    return table(["workload", "target decodes per answer token", "rows per drafting step",
                  "accepted, tokens 0-15", "16-63", "64+", "draft lengths verified (length:steps)"], rows)


def plot_svg(data):
    """Median tok/s by workload and configuration, as a standalone SVG bar chart."""
    fig = Figures(data)
    names = [w["name"] for w in fig.workloads]
    cfgs = fig.configs
    colours = ["#4e79a7", "#59a14f", "#9c755f", "#e15759", "#f28e2b", "#edc948", "#b07aa1", "#76b7b2"]
    values = {(c, wl): fig.median_speed(c, wl) for c in cfgs for wl in names}
    top = max([v for v in values.values() if v == v] + [1.0])
    step = 10 ** math.floor(math.log10(top)) / 2
    top = math.ceil(top / step) * step
    W, H, left, bottom, right = 960, 380, 50, 40, 220
    group = (W - left - right) / len(names)
    bar = group * 0.85 / len(cfgs)
    y = lambda v: H - bottom - (H - bottom - 20) * v / top  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
           f'font-size="11">', f'<rect width="{W}" height="{H}" fill="white"/>']
    t = 0.0
    while t <= top + 1e-9:
        out.append(f'<line x1="{left}" x2="{W - right}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 4}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
        t += step
    for gi, wl in enumerate(names):
        x0 = left + gi * group + group * 0.075
        for ci, c in enumerate(cfgs):
            v = values[(c, wl)]
            if v != v:
                continue
            hatch = ' stroke="black" stroke-dasharray="2,2"' if c.startswith("native") else ""
            out.append(f'<rect x="{x0 + ci * bar:.1f}" y="{y(v):.1f}" width="{bar * 0.9:.1f}" '
                       f'height="{H - bottom - y(v):.1f}" fill="{colours[ci % len(colours)]}"{hatch}/>')
        out.append(f'<text x="{left + (gi + 0.5) * group:.1f}" y="{H - bottom + 16}" text-anchor="middle">'
                   f'{html.escape(wl)}</text>')
    out.append(f'<text x="14" y="{(H - bottom) / 2:.0f}" transform="rotate(-90 14 {(H - bottom) / 2:.0f})" '
               f'text-anchor="middle">tok/s (median over rounds)</text>')
    for ci, c in enumerate(cfgs):
        yy = 30 + ci * 18
        dash = ' stroke="black" stroke-dasharray="2,2"' if c.startswith("native") else ""
        out.append(f'<rect x="{W - right + 14}" y="{yy - 10}" width="12" height="12" '
                   f'fill="{colours[ci % len(colours)]}"{dash}/><text x="{W - right + 32}" y="{yy}">'
                   f'{html.escape(c)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def readme_with(text, section):
    """README text with the speed section replaced (the markers must be there)."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"README.md has no speed section markers ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + section + END + tail


def readme_section_of(text):
    """The generated part of README text (between the markers)."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")


def outputs(data):
    """{path: text} of everything rendered from ``data``."""
    readme = README.read_text(encoding="utf-8")
    return {REPORT: render_report(data), PLOT: plot_svg(data), README: readme_with(readme, readme_section(data))}


def write_all(data):
    for path, text in outputs(data).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {_rel(path)}")


def stale(data):
    """The rendered files that differ from what ``data`` renders."""
    return [p for p, text in outputs(data).items() if not p.exists() or p.read_text(encoding="utf-8") != text]


def _rel(path):
    return str(Path(path).relative_to(ROOT))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=JSON, help="the bench's figures (default tools/bench/speed.json)")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--write", action="store_true", help="write the report, the plot and the README table")
    how.add_argument("--check", action="store_true", help="exit 1 if a rendered file is out of date")
    args = ap.parse_args(argv)
    data = json.loads(args.json.read_text(encoding="utf-8"))
    if args.write:
        write_all(data)
    elif args.check:
        old = stale(data)
        for p in old:
            print(f"{_rel(p)} differs from what {_rel(args.json)} renders (python tools/bench/report.py --write)")
        return 1 if old else 0
    else:
        print(render_report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
