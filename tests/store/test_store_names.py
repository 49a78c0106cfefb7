"""Model names, precisions in file names, and how a repo's files are classified."""
import pytest

from geniex.errors import UsageError
from geniex.store import classify
from geniex.store.hub import find_token
from geniex.store.names import order_precisions, parse_name, precision_of, shard_of

pytestmark = pytest.mark.fast   # needs no model: the fast tier


def test_parse_name_normalizes_precision():
    name = parse_name("unsloth/Qwen3-0.6B-GGUF:q4_k_m")
    assert (name.org, name.repo, name.precision) == ("unsloth", "Qwen3-0.6B-GGUF", "Q4_K_M")
    assert str(name) == "unsloth/Qwen3-0.6B-GGUF:Q4_K_M"
    assert parse_name("a/b").precision is None


@pytest.mark.parametrize("bad", ["llama3", "a/b/c", "a/", "/b", "a/../b", "a/b:", "a/b:Q4 0", "-a/b"])
def test_parse_name_rejects_malformed(bad):
    with pytest.raises(UsageError, match="org/repo"):
        parse_name(bad)


@pytest.mark.parametrize("path, precision", [
    ("model-Q4_K_M.gguf", "Q4_K_M"),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1"),
    ("gemma-3-4b-it-q4_0.gguf", "Q4_0"),
    ("model_q8_0.gguf", "Q8_0"),
    ("Qwen3-8B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
    ("Llama-3-8B-IQ2_XXS.gguf", "IQ2_XXS"),
    ("model-bf16.gguf", "BF16"),
    ("model-fp16.gguf", "F16"),
    ("Q4_K_M/model-Q4_K_M-00001-of-00002.gguf", "Q4_K_M"),
    ("Q6_K/model-00001-of-00002.gguf", "Q6_K"),
    ("model-Q4_0_4_4.gguf", "Q4_0_4_4"),
    ("Llama-v3.2-3B-w4a16.bin", "W4A16"),
    ("model.gguf", None),
])
def test_precision_of_file_names(path, precision):
    assert precision_of(path) == precision


def test_shards_and_order():
    assert shard_of("x-Q4_0-00002-of-00003.gguf") == (2, 3)
    assert shard_of("x-Q4_0.gguf") is None
    assert order_precisions(["F16", "Q8_0", "Q2_K", "Q4_K_M", "Q4_0"]) == ["Q4_0", "Q4_K_M", "Q8_0", "F16", "Q2_K"]


@pytest.mark.parametrize("name, expected", [
    ("mmproj.gguf", True), ("mmproj-F16.gguf", True), ("gemma-3-4b-it-mmproj.gguf", True),
    ("x_mmproj_f16.gguf", True), ("MMPROJ-model-f16.gguf", True), ("model-Q4_0.gguf", False),
])
def test_mmproj_names(name, expected):
    assert classify.is_mmproj(name) is expected


def test_plan_groups_shards_mmproj_and_mtp():
    layout = classify.plan([
        "README.md", "config.json",
        "m-Q8_0.gguf", "m-mtp-Q8_0.gguf", "mmproj-F16.gguf", "mmproj-Q8_0.gguf",
        "F16/m-F16-00001-of-00002.gguf", "F16/m-F16-00002-of-00002.gguf",
    ])
    assert layout.runtime == "llama_cpp"
    assert layout.precisions == ["Q8_0", "F16"]
    q8, f16 = layout.groups["Q8_0"], layout.groups["F16"]
    assert q8.files == ["m-Q8_0.gguf"] and q8.mmproj == "mmproj-Q8_0.gguf" and q8.mtp == ["m-mtp-Q8_0.gguf"]
    assert f16.files == ["F16/m-F16-00001-of-00002.gguf", "F16/m-F16-00002-of-00002.gguf"]
    assert f16.mmproj == "mmproj-F16.gguf" and not f16.draft


def test_plan_draft_only_repo_and_qairt_repo():
    drafts = classify.plan(["gemma-4-assistant-mtp-Q4_0.gguf"])
    assert drafts.groups["Q4_0"].draft
    qairt = classify.plan([".gitattributes", "README.md", "genie_config.json", "model.bin", "tokenizer.json"])
    assert qairt.runtime == "qairt"
    assert qairt.groups["DEFAULT"].files == ["genie_config.json", "model.bin", "tokenizer.json"]


def test_model_type_signals():
    assert classify.model_type() == "llm"
    assert classify.model_type(has_mmproj=True) == "vlm"
    assert classify.model_type(config={"vision_config": {}}) == "vlm"
    assert classify.model_type("llm", config={"vision_config": {}}, has_mmproj=True) == "llm"


def test_token_order(tmp_path):
    (tmp_path / "token").write_text("from-file\n")
    env = {"HF_HOME": str(tmp_path)}
    assert find_token(env) == "from-file"
    assert find_token({**env, "HF_TOKEN": "hf"}) == "hf"
    assert find_token({**env, "HF_TOKEN": "hf", "GENIEX_HFTOKEN": "gx"}) == "gx"
    assert find_token({"HF_HOME": str(tmp_path / "none")}) is None
