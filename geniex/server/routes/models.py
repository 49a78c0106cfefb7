"""``GET /v1/models`` and ``GET /v1/models/{model}``: what the store holds."""
from flask import Blueprint, current_app, jsonify

from geniex.errors import GenieXError

bp = Blueprint("models", __name__)


def _model(model_id, runtime, type_, created=0):
    owner = model_id.split("/", 1)[0] if "/" in model_id and not model_id.startswith("/") else "local"
    return {"id": model_id, "object": "model", "created": created, "owned_by": owner,
            "runtime": runtime, "type": type_}


def _created(store, model_id):
    # When the files arrived in the store; 0 if they cannot be read right now.
    try:
        files = store.resolve(model_id).files
        return int(max(f.stat().st_mtime for f in files)) if files else 0
    except (GenieXError, OSError):
        return 0


@bp.get("/v1/models")
@bp.get("/models")
def list_models():
    """One entry per stored precision (``org/repo:PRECISION``); the default model
    (``--model``, else the resident one) first, marked ``"default": true``."""
    placer = current_app.extensions["geniex.answerer"].placer
    store = placer.store
    data = []
    for row in store.list_models():
        for precision in row["precisions"]:
            model_id = f"{row['name']}:{precision}"
            data.append(_model(model_id, row["runtime"], row["type"], _created(store, model_id)))
    default = placer.resident()
    if default is not None:
        try:
            default = store.resolve(default, paths=placer.allow_paths).name
        except GenieXError:
            default = None
    config = current_app.config["GENIEX"]
    for i, entry in enumerate(data):
        if entry["id"] == default:
            entry = {**data.pop(i), "default": True}
            if config.aliases:
                # As llama-server: the model goes by its aliases, the first in sort order its id.
                entry.update(id=sorted(config.aliases)[0], aliases=sorted(config.aliases), name=default)
            if config.tags:
                entry["tags"] = list(config.tags)
            data.insert(0, entry)
            break
    return jsonify({"object": "list", "data": data})


@bp.get("/v1/models/<anypath:model>")
@bp.get("/models/<anypath:model>")
def get_model(model):
    """One model, by any name the store resolves (``org/repo``, ``org/repo:P``; a GGUF path
    with ``--allow-paths``)."""
    placer = current_app.extensions["geniex.answerer"].placer
    found = placer.resolve(model)     # 404 for anything not a loadable model (placement.Placer.resolve)
    return jsonify(_model(found.name, found.runtime, found.type, _created(placer.store, found.name)))
