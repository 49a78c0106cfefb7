"""The accept loop and every drafting method on the real demo model.

The promise under test: speculative output is the plain output, token for token, for
greedy and seeded sampling, including where the answer ends. These tests run with the
default numerics (the default threads, flash attention auto, micro-batches of 32 rows), under which llama.cpp computes every verify row bitwise like a one-row decode
(README, "Identical output"); so they assert exact equality, not near-ties.
"""
import json
import re

import pytest

from geniex.engine.chat import Conversation
from geniex.engine.loop import GenOptions
from geniex.engine.session import LoadOptions, Session
from geniex.llama import cache_types
from geniex.speculative.options import SpecOptions
from geniex.engine.sampling import SamplingParams
from geniex.speculative.drafters.base import Draft, Drafter
from geniex.speculative.options import FALLBACK
from geniex.speculative.policy import FixedPolicy, GainPolicy

REPEAT = ("Repeat the following text exactly:\nThe quick brown fox jumps over the lazy dog. "
          "The quick brown fox jumps over the lazy dog again.")
CODE = ("Rewrite this function with the variable renamed from total to result:\n\n"
        "def add(a, b):\n    total = a + b\n    print('sum', a, b, total)\n    return total\n")
# Notes before the request: the essay fills the 256-token context after 12 tokens of answer.
# What the essay is for is an answer that ends because the context is full; each of its 8
# answers (the plain one and 7 methods) decodes every answer token, while the prompt is
# prefilled once per context (plain, speculative, two draft contexts), so the notes are
# long and the answer short (with 175 prompt tokens, 82 answer tokens made the essay
# three fifths of the module's decoding). 12 tokens: Oracle(7)'s second step is cut to 3
# drafts by the room left (test_full_context_inside_an_accepted_run).
ESSAY = ("My notes: Rome was founded, by legend, in 753 BC by Romulus and Remus. It was a kingdom, then a "
         "republic led by two consuls, elected every year, and the senate. It fought Carthage in three Punic "
         "Wars and won them; Hannibal crossed the Alps with elephants. Julius Caesar conquered Gaul and crossed "
         "the Rubicon in 49 BC; he was killed on the Ides of March, 44 BC. Augustus became the first emperor in "
         "27 BC and began the Pax Romana. The empire reached its largest extent under Trajan, from Britain to "
         "Mesopotamia; Hadrian built a wall. Diocletian split its rule among four emperors; Constantine made "
         "Christianity legal and founded Constantinople. The western empire fell in 476 AD; the eastern empire, "
         "Byzantium, lasted until its fall in 1453. Latin, roads, aqueducts and law are among its legacies. "
         "Using these notes, write a long essay about the history of the Roman Empire, with many details.")
GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, seed=2)
METHODS = ["ngram-mod", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache",
           "draft-simple", "ngram-mod,draft-simple"]


def self_draft(model):
    """draft-simple with ``model`` drafting for itself at fixed lengths of up to 4."""
    return SpecOptions(types=("draft-simple",), draft_path=model, n_max=4, policy="fixed")


def answer(session, prompt, sampling, max_tokens=120, stop=(), drafter=None, steps=None):
    """Tokens and stats of one answer (optionally with a given drafter). The prompt is
    reused from the KV cache where the session's last answer had the same one (the same
    bits a new prefill would write): only the answer is decoded."""
    if drafter is not None:
        session.drafter = drafter
    try:
        chat = Conversation(session)
        gen = chat.ask(prompt, GenOptions(max_tokens=max_tokens, stop=stop, sampling=sampling))
        for step in gen:
            if steps is not None:
                steps.append(step)
        return gen.tokens, gen.stats
    finally:
        if drafter is not None:
            session.drafter = None


@pytest.fixture(scope="module")
def short_bench(demo_model):
    """A speculative session (nctx 256) loaded with both drafter families at their
    defaults, the auto draft policy; each other method's drafter is built on it at its
    defaults and swapped in (tests/support/identity.py, Bench). draft-simple alone drafts
    fixed lengths (:func:`self_draft`): the demo model drafting for itself costs what it
    saves, so the auto policy verifies none of its drafts (seeded, it verified none in 60
    tokens) after paying for them; at fixed lengths each prompt verifies and accepts
    drafts, in fewer target steps. The auto policy's way with draft-simple is the bench's
    own method."""
    from identity import Bench
    both = "ngram-mod,draft-simple"

    def options(method):
        if method == "draft-simple":
            return self_draft(demo_model)
        return SpecOptions(types=tuple(method.split(",")), draft_path=demo_model if "draft" in method else None)
    # The default threads (one per pytest-xdist worker, tests/support/parallel.py): these
    # contexts hold 256 tokens, below the 512 cells from which a one-row decode's attention
    # splits per thread; the long benches (test_identity_long) decode on two or more.
    bench = Bench(demo_model, 256, both, SpecOptions(types=tuple(both.split(",")), draft_path=demo_model), options,
                  threads=0)
    bench.size_by_quiet_curve()
    yield bench
    bench.close()


@pytest.fixture(scope="module")
def plain(short_bench):
    """The plain session (nctx 256) of the short bench."""
    return short_bench.plain


@pytest.fixture(scope="module")
def reference(plain):
    """Plain answers, computed once: {(prompt, sampling name, max_tokens, stop): (tokens, stats)}."""
    cache = {}

    def get(prompt, sampling, max_tokens=120, stop=()):
        key = (prompt, repr(sampling), max_tokens, stop)
        if key not in cache:
            cache[key] = answer(plain, prompt, sampling, max_tokens, stop)
        return cache[key]
    return get


# What every method answers: a quoting prompt (seeded: every n-gram method drafts and
# accepts in it, asserted; a seeded answer to the code prompt wandered off the code once
# prompts were read in F16, and some methods then found nothing to draft), code (greedy,
# 32 tokens), and the essay that fills the 256-token context (greedy, 12 tokens).
PROMPTS = ((REPEAT, SEEDED, 120), (CODE, GREEDY, 32), (ESSAY, GREEDY, 400))


@pytest.fixture(scope="module")
def every_method_answers(short_bench):
    """Every method's answers to :data:`PROMPTS` on the short bench, ``{method: [(tokens,
    stats), ...]}`` (or the exception the method raised, for its own test to raise).

    Prompt by prompt, every method in turn: the speculative session prefills each prompt
    once and the other methods' answers reuse it from the KV cache (the same bits a new
    prefill would write), where method by method it prefilled every prompt again for
    every method. Each method's drafter still sees its own answers in the same order."""
    out = {m: [] for m in METHODS}
    for prompt, sampling, max_tokens in PROMPTS:
        for method in METHODS:
            if isinstance(out[method], Exception):
                continue
            try:
                with short_bench.drafting(method) as s:
                    out[method].append(answer(s, prompt, sampling, max_tokens))
            except Exception as e:      # raised again by the method's own test
                out[method] = e
    return out


@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_identical_to_plain(method, every_method_answers, reference):
    answers = every_method_answers[method]
    if isinstance(answers, Exception):
        raise answers
    drafted = accepted = 0
    for (prompt, sampling, max_tokens), (got_tokens, got_stats) in zip(PROMPTS, answers, strict=True):
        want_tokens, want_stats = reference(prompt, sampling, max_tokens)
        assert got_tokens == want_tokens, (method, prompt[:20])
        assert got_stats.stop_reason == want_stats.stop_reason
        drafted += got_stats.drafted
        accepted += got_stats.accepted
        if sampling is SEEDED:      # the seeded identity is not vacuous either
            assert got_stats.accepted > 0, (method, "accepted no draft in the seeded answer")
    assert drafted > 0 and accepted > 0, "the method never drafted and accepted: the test would prove nothing"
    # The essay fills the 256-token context: the end is the same too.
    assert want_stats.stop_reason == "context_length"


# Before the Oracle tests on REPEAT: the plain session's last answer is the essay's reference
# (test_every_method_is_identical_to_plain), so its prompt is reused, not prefilled again.
def test_full_context_inside_an_accepted_run(plain, reference):
    want, want_stats = reference(ESSAY, GREEDY, 400)
    assert want_stats.stop_reason == "context_length"
    steps = []
    got, stats = answer(plain, ESSAY, GREEDY, 400, drafter=Oracle(want, 7), steps=steps)
    assert got == want and stats.stop_reason == "context_length"
    # The context fills inside a run of accepted drafts: the last verify's drafts were cut
    # by the room left (fewer than the oracle's 7), and all of them were accepted.
    last = [s for s in steps if s.target][-1]
    assert 0 < len(last.drafted) < 7 and last.accepted == len(last.drafted), last


class Oracle(Drafter):
    """Proposes exactly what plain decoding produced: every draft is accepted."""

    name = "oracle"

    def __init__(self, ref, k):
        self.ref, self.k = ref, k
        self.n_max = k

    def begin(self, history, n_past, target_row):
        self.start = n_past + 1      # history index of the first answer token

    def propose(self, history, n_past, room):
        i = n_past + 1 - self.start
        return Draft(list(self.ref[i:i + self.limit(room)]))


class Contrarian(Oracle):
    """Proposes a wrong first token every time: nothing is ever accepted."""

    name = "contrarian"

    def propose(self, history, n_past, room):
        i = n_past + 1 - self.start
        nxt = self.ref[i] if i < len(self.ref) else 0
        return Draft([(nxt + 1) % 1000, 5, 6][:self.limit(room)])


def test_oracle_drafter_counters_and_multi_token_commits(plain, reference):
    want, want_stats = reference(REPEAT, GREEDY)
    steps = []
    got, stats = answer(plain, REPEAT, GREEDY, drafter=Oracle(want, 4), steps=steps)
    assert got == want and stats.stop_reason == want_stats.stop_reason
    assert stats.accepted == stats.drafted > 0 and stats.accept_rate == 1.0
    assert stats.drafted == sum(len(s.drafted) for s in steps)
    assert max(len(s.committed) for s in steps) == 5          # 4 drafts + the target's token
    assert stats.steps < len(want) / 2
    assert sum(stats.accept_hist) == sum(1 for s in steps if s.drafted)


def test_always_wrong_drafter_counters(plain, reference):
    want, _ = reference(REPEAT, GREEDY)
    steps = []
    got, stats = answer(plain, REPEAT, GREEDY, drafter=Contrarian(want, 3), steps=steps)
    assert got == want
    assert stats.accepted == 0
    # Only the first draft of each step is checked: it is wrong, the rest is never looked at.
    assert stats.drafted == sum(1 for s in steps if s.drafted) == stats.accept_hist[0]
    assert all(len(s.committed) <= 1 for s in steps)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_endings_inside_accepted_runs(plain, reference, sampling):
    """eos, stop strings and max tokens landing in the middle of a run of accepted drafts
    end the answer exactly where plain decoding ends it."""
    full, full_stats = reference(REPEAT, sampling)
    inside = 0
    cases = [dict(max_tokens=n) for n in range(1, 14)]
    text = plain.vocab.detokenize(full)
    cases += [dict(stop=(text[i:i + 3],)) for i in (5, 11, 17, 23, 30) if text[i:i + 3].strip()]
    cases.append({})   # the natural end (eos)
    for case in cases:
        n = case.get("max_tokens")
        if n is not None and n < len(full):
            # Plain decoding cut at n tokens before its natural end is the first n of its
            # full answer (one draw per token from the same stream): no plain run of its own.
            want, want_stop = full[:n], "length"
        elif n is not None and n > len(full) and full_stats.stop_reason == "eos":
            # Nor a limit past the end token: the answer never reaches it. (A limit at the
            # answer's length, where the limit and the end token meet, runs plainly.)
            want, want_stop = full, "eos"
        else:
            want, want_stats = reference(REPEAT, sampling, case.get("max_tokens", 120), case.get("stop", ()))
            want_stop = want_stats.stop_reason
        steps = []
        got, stats = answer(plain, REPEAT, sampling, case.get("max_tokens", 120), case.get("stop", ()),
                            drafter=Oracle(full, 5), steps=steps)
        assert got == want, case
        assert stats.stop_reason == want_stop, case
        last = [s for s in steps if s.target][-1]
        if last.accepted and len(last.target) <= len(last.drafted):
            inside += 1      # the step ended on a draft row, not on the target's own row
    if sampling is GREEDY:
        assert full_stats.stop_reason == "eos"      # the natural end is an end token
    # Stop strings and the end token land inside accepted runs (the loop never drafts
    # past --max-tokens, so a length stop always falls on the target's own row).
    assert inside >= 3


def test_draft_simple_drafting_for_itself_accepts_everything(short_bench, reference):
    # Fixed lengths: a model drafting for itself costs what it saves, so the auto policy
    # would (rightly) stop drafting; this test is about acceptance. The short bench's
    # draft-simple drafter (:func:`self_draft`, built by the engine's builder on its
    # target, tests/support/identity.py).
    with short_bench.drafting("draft-simple") as s:
        assert s.drafter.n_max == 4 and isinstance(s.policy, FixedPolicy)
        want, _ = reference(REPEAT, GREEDY)
        got, stats = answer(s, REPEAT, GREEDY)
        assert got == want
        assert stats.drafted > 0 and stats.accepted == stats.drafted
        # The draft reads prompts in 512-row calls (capped by its context) from an F16 cache:
        # its cells shape guesses only.
        assert s.drafter.ctx.n_batch == min(512, s.drafter.ctx.n_ctx)
        assert s.drafter.ctx.type_k == s.drafter.ctx.type_v == cache_types.F16


def test_a_requests_own_auto_policy_leaves_the_loaded_policy_as_it_was(plain, reference):
    """A session loaded without drafters (so with the fixed policy) answers a request's own
    ``auto`` n-gram setup by an auto policy of its own, made once; the loaded policy, which
    the answers that ask for nothing draft by, is not replaced."""
    tokens = Conversation(plain).prompt_tokens([{"role": "user", "content": REPEAT}])
    for _ in range(2):
        gen = plain.generate(tokens, GenOptions(max_tokens=120, sampling=GREEDY),
                             spec=SpecOptions(types=("ngram-mod",), policy="auto"))
        gen.run()
        assert gen.tokens == reference(REPEAT, GREEDY)[0] and gen.stats.drafted > 0
        made = plain.own_policy
        assert isinstance(made, GainPolicy) and isinstance(plain.policy, FixedPolicy)
    assert plain.own_policy is made


def test_ngram_mod_drafts_and_accepts_on_a_quoting_prompt(short_bench, reference):
    spec = SpecOptions(types=("ngram-mod",), policy="fixed")
    with short_bench.drafting("ngram-mod, fixed lengths", spec) as s:
        got, stats = answer(s, REPEAT, GREEDY)
        assert got == reference(REPEAT, GREEDY)[0]
        assert stats.drafted >= 8 and stats.accept_rate >= 0.5
        assert max(n for n, c in enumerate(stats.accept_hist) if c) >= 2


def test_incompatible_vocabulary_is_refused(demo_model, tiny):
    target, _ = tiny["pair"]
    s = Session(demo_model, LoadOptions(nctx=256, spec=SpecOptions(types=("draft-simple",), draft_path=target)))
    try:
        assert s.drafter is None
        assert FALLBACK in s.spec_notes[0] and "vocabulary sizes differ" in s.spec_notes[0]
    finally:
        s.close()


@pytest.mark.parametrize("spec, reason", [
    (dict(types=("draft-simple",)), "draft-simple needs a draft model"),
    (dict(types=("draft-mtp",)), "draft-mtp needs a draft model"),
    (dict(types=("draft-eagle3",), draft_path="TARGET"), "not an EAGLE-3 draft"),
], ids=["draft-simple-without-draft", "draft-mtp-without-draft", "eagle3-not-a-draft"])
def test_setup_failures_fall_back_to_plain_answers(demo_model, tiny, spec, reason):
    """What the engine refuses to set up (in process; the CLI's line for it is checked
    below with another of the engine's refusals): the session answers plainly."""
    if spec.get("draft_path") == "TARGET":
        spec = dict(spec, draft_path=tiny["pair"][0])
    s = Session(demo_model, LoadOptions(nctx=256, spec=SpecOptions(**spec)))
    try:
        assert s.drafter is None and not s.speculative
        assert FALLBACK in s.spec_notes[0] and reason in s.spec_notes[0], s.spec_notes
        gen = Conversation(s).ask("Name the capital of France.", GenOptions(max_tokens=8, sampling=GREEDY))
        assert "Paris" in gen.run()
    finally:
        s.close()


def test_setup_failures_fall_back_with_the_geniex_line(cli, tmp_path, tiny):
    """The line through the CLI: a refusal of the engine's (an unknown method; the others
    are checked in process above, and a draft of another vocabulary by
    test_incompatible_vocabulary_is_refused) and the CLI's own when a draft model cannot
    be had (a missing file, a name the Hub does not have)."""
    cases = [
        (["--spec-type", "ngram-bogus"], "unknown speculative method ngram-bogus"),
        (["--spec-type", "draft-simple", "--draft-model", tmp_path / "missing.gguf"], "missing.gguf"),
        (["--spec-type", "draft-mtp", "--draft-model", "nobody/nothing-here-GGUF"], "nobody/nothing-here-GGUF"),
    ]
    for extra, reason in cases:
        proc = cli("infer", "-p", "Name the capital of France.", "--max-tokens", "8", *extra,
                   env={"HF_ENDPOINT": "http://127.0.0.1:9"})
        assert proc.returncode == 0, proc.stderr
        assert FALLBACK in proc.stderr and reason in proc.stderr, (extra, proc.stderr)
        assert "Paris" in proc.stdout


def test_trace_file_matches_the_counters(cli, tmp_path):
    trace = tmp_path / "trace.jsonl"
    proc = cli("infer", "-p", REPEAT, "--spec-type", "ngram-mod", "--spec-trace", trace, "--verbose",
               "--draft-policy", "fixed")
    assert proc.returncode == 0, proc.stderr
    m = re.search(r"^draft accept:\s+(\d+)/(\d+) \(([\d.]+)%\)", proc.stderr, re.M)
    assert m, proc.stderr
    accepted, drafted = int(m.group(1)), int(m.group(2))
    lines = [json.loads(l) for l in trace.read_text().splitlines()]
    steps, summary = lines[:-1], lines[-1]["summary"]
    assert sum(s["accepted"] for s in steps) == accepted == summary["accepted"]
    examined = sum(min(len(s["target"]), len(s["drafted"])) for s in steps)
    assert examined == drafted == summary["drafted"]
    assert "".join(s["text"] for s in steps).strip() == proc.stdout.strip()
    assert steps[-1]["stop"] == summary["stop_reason"]
    assert all(s["method"] in ("ngram-mod", "") for s in steps)
    assert sum(len(s["committed"]) for s in steps) == summary["decode_tokens"]
    assert re.search(r"• \d+% accept —", proc.stderr) is None      # verbose prints the block
    # Fixed drafts: the auto policy may find drafting not worth it on one thread of a
    # 2-core machine (a batch row costs nearly a decode there) and print no accept rate.
    short = cli("infer", "-p", REPEAT, "--spec-type", "ngram-mod", "--draft-policy", "fixed")
    assert re.search(r"• \d+% accept —$", short.stderr, re.M), short.stderr


def test_qairt_model_warns_and_refuses(cli, fake_hub):  # noqa: F811
    fake_hub.add_repo("qualcomm/Tiny-Bundle", {"genie_config.json": b"{}", "model.bin": b"\0" * 64})
    env = {"HF_ENDPOINT": fake_hub.url}
    assert cli("pull", "qualcomm/Tiny-Bundle", env=env).returncode == 0
    proc = cli("infer", "qualcomm/Tiny-Bundle", "-p", "hi", "--spec-type", "ngram-mod", env=env)
    assert proc.returncode != 0
    assert "speculative decoding is only supported by llama_cpp" in proc.stderr
    assert "qairt" in proc.stderr


def test_multimodal_model_runs_text_path_with_warning(cli, demo_model):
    assert cli("pull", "someone/Vision-Demo", "--local-path", demo_model, "--model-type", "vlm").returncode == 0
    # Fixed draft lengths: the store's hard link is another file to the calibration
    # cache, and the auto policy would measure its curves (two, seconds) before answering.
    proc = cli("infer", "someone/Vision-Demo", "-p", "Name the capital of France.", "--spec-type", "ngram-mod",
               "--max-tokens", "8", "--draft-policy", "fixed")
    assert proc.returncode == 0 and "Paris" in proc.stdout
    assert "multimodal" in proc.stderr and "image/audio content is dropped" in proc.stderr


def test_the_policy_shows_its_choices_in_the_trace_and_the_profile(cli, tmp_path):
    """With the default policy, what the drafter offered and what was verified agree
    between the trace (``offered``, ``grade``) and the verbose profile's policy line."""
    trace = tmp_path / "trace.jsonl"
    proc = cli("infer", "-p", REPEAT, "--spec-type", "ngram-mod", "--spec-trace", trace, "--verbose")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(l) for l in trace.read_text().splitlines()]
    steps, summary = lines[:-1], lines[-1]["summary"]
    offered = sum(s.get("offered", len(s["drafted"])) for s in steps)
    skipped = sum(1 for s in steps if s.get("offered") and not s["drafted"])
    assert (summary["offered"], summary["skipped"]) == (offered, skipped)
    assert all(1 <= s["grade"] <= 4 for s in steps if s.get("offered") or s["drafted"])
    if offered > summary["drafted"]:
        assert (f"draft policy:   verified {summary['drafted']} of {offered} offered draft tokens; "
                f"{skipped} steps verified none of their draft") in proc.stderr
    else:
        assert "draft policy:" not in proc.stderr
    assert offered > 0
