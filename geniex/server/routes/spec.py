"""``POST /v1/spec/reset``: forget what speculative drafting learned from earlier answers.

The n-gram methods keep a memory of every answer for as long as a model stays loaded
(docs/speculative.md, "N-gram memory"); a client that wants a fresh start (a benchmark, a
new unrelated task) resets it here without reloading the model.
"""
from flask import Blueprint, current_app, jsonify

bp = Blueprint("spec", __name__)


@bp.post("/v1/spec/reset")
def reset():
    """Reset the resident model's drafting memory (and its KV cache)."""
    name = current_app.extensions["geniex.answerer"].cache.forget_drafts()
    return jsonify({"object": "spec.reset", "model": name, "reset": name is not None})
