"""`geniex infer` pulls what it is missing, the model and a `--draft-model` given by
name, from a Hub played by a local server (never a real hub)."""
from geniex.store import Store


def test_infer_pulls_target_and_mtp_draft_then_speculates(cli, data_dir, fake_hub, tiny):  # noqa: F811
    target, assistant = tiny["aligned"]
    fake_hub.add_repo("tiny/Gemma4-Target-GGUF", {"gemma4-target-Q8_0.gguf": target.read_bytes()})
    # An MTP draft repo: 'mtp' in the file name, so it is never listed as a model.
    fake_hub.add_repo("tiny/Gemma4-Assistant-GGUF", {"gemma4-assistant-mtp-Q8_0.gguf": assistant.read_bytes()})
    env = {"HF_ENDPOINT": fake_hub.url}
    proc = cli("infer", "tiny/Gemma4-Target-GGUF:Q8_0", "-p", "the cat sat on the mat", "--max-tokens", "24",
               "--spec-type", "draft-mtp", "--draft-model", "tiny/Gemma4-Assistant-GGUF:Q8_0", "--verbose",
               "--draft-policy", "fixed", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("Model is not cached, downloading...") == 2
    assert "speculative decoding: draft-mtp" in proc.stderr
    assert "draft accept:" in proc.stderr
    # What `geniex list` shows (its rows, read in process): the model, not its MTP draft.
    rows = {r["name"] for r in Store(data_dir).list_models()}
    assert "tiny/Gemma4-Target-GGUF:Q8_0" in rows or "tiny/Gemma4-Target-GGUF" in rows
    assert not any("Assistant" in r for r in rows)
    # Second run: everything is cached, nothing is downloaded.
    again = cli("infer", "tiny/Gemma4-Target-GGUF", "-p", "the cat", "--max-tokens", "4",
                "--spec-type", "draft-mtp", "--draft-model", "tiny/Gemma4-Assistant-GGUF", env=env)
    assert again.returncode == 0 and "downloading" not in again.stderr


def test_infer_of_a_model_the_hub_does_not_have(cli, fake_hub):  # noqa: F811
    proc = cli("infer", "nobody/Missing-GGUF", "-p", "hi", env={"HF_ENDPOINT": fake_hub.url})
    assert proc.returncode != 0
    assert "Model is not cached, downloading..." in proc.stderr and "404" in proc.stderr
