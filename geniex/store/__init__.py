"""The model store: names, manifests, Hub downloads, and the resolver everything uses.

    from geniex.store import Store
    store = Store(geniex.config.data_dir(flag))
    model = store.resolve("org/repo:Q4_0")       # -> ResolvedModel, or ModelNotFound
"""
from geniex.store.demo import DEMO_NAME, demo_model_path
from geniex.store.resolved import ResolvedModel
from geniex.store.store import Store

__all__ = ["DEMO_NAME", "ResolvedModel", "Store", "demo_model_path"]
