"""tools/bench/kv_quality.py on two short chunks: it runs, and q8_0 stays close to f16."""
import numpy as np


def test_kv_quality_measures_kl_and_agreement(demo_model, capsys):
    from shared_fixtures import load_tool
    kv_quality = load_tool("bench/kv_quality.py")
    from geniex.llama.objects import Model
    model = Model(demo_model)
    tokens = model.vocab.tokenize(kv_quality.prose(), add_special=False)[:63]
    kl, agree, nll = kv_quality.measure(model, tokens, ["q8_0"], chunk=32, threads=1)
    # two chunks of BOS + 31 tokens; the BOS rows are not scored, nor the last token
    # (nothing follows it). (Measured here: mean KL 0.005, agreement 97%, perplexity
    # within 1%: far inside the bounds below at these 62 positions as at 126.)
    assert len(kl["q8_0"]) == len(agree["q8_0"]) == len(nll["f16"]) == 62
    assert (kl["q8_0"] >= -1e-9).all() and 0 < kl["q8_0"].mean() < 0.05
    assert agree["q8_0"].mean() > 0.85
    assert abs(np.exp(nll["q8_0"].mean()) / np.exp(nll["f16"].mean()) - 1) < 0.05
    assert kv_quality.main(["--tokens", "20", "--chunk", "32", "--types", "q4_0"]) == 0
    out = capsys.readouterr().out
    assert "| f16 (reference) | 0 |" in out and "| q4_0 |" in out
