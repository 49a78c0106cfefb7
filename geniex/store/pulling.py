"""``pull`` from the Hub: list the repo, pick a precision, download, record.

The manifest gains the precision only after every file of it is verified and in
place. While downloading, the pull holds the model folder's ``.pull.lock`` shared:
other pulls may run alongside (per-file locks keep them apart), but ``remove`` and
``clean`` keep their hands off the folder until it is done.
"""
import json
import logging

from geniex.errors import ModelNotFound, shown
from geniex.store import classify, download
from geniex.store.errors import HubError
from geniex.store.locking import file_lock
from geniex.store.manifest import MANIFEST, PULL_LOCK, Manifest, editing, inside, reserved
from geniex.store.picker import choose_precision

log = logging.getLogger(__name__)

MAX_CONFIG = 1 << 20    # bytes of config.json read (as listed, and as received after decompression)


def pull_from_hub(hub, folder, name, model_type=None, out=None, interactive=None):
    """Fetch ``name`` (a ModelName) from ``hub`` into ``folder``; returns the precision."""
    remote = {f.path: f for f in hub.list_files(name.repo_id) if f.path != MANIFEST}
    layout = classify.plan(list(remote))
    groups = {p: g for p, g in layout.groups.items() if g.files}
    if not groups:
        raise HubError(f"{name.repo_id} on {hub.endpoint} has no model files to pull")
    precisions = [p for p in layout.precisions if p in groups]
    sizes = {p: sum(remote[f].size for f in groups[p].all_files) for p in precisions}
    precision = name.precision or choose_precision(name.repo_id, precisions, sizes, interactive, out)
    if precision not in groups:
        raise ModelNotFound(f"{name.repo_id} has no precision {precision}; available: {', '.join(precisions)}")
    group = groups[precision]
    for path in group.all_files:
        why = reserved(path, set(group.all_files))
        if why:
            raise HubError(f"{name.repo_id} on {hub.endpoint} has a file named {shown(path)!r}, which the store "
                           f"cannot hold ({why}); refusing to pull it")
    existing = Manifest.load(folder)
    mtype = model_type or (existing.type if existing else
                           classify.model_type(None, _config(hub, name.repo_id, remote), layout.has_mmproj))

    with file_lock(folder / PULL_LOCK, shared=True):
        for path in group.all_files:
            if not _held(existing, folder, remote[path]):
                dest = inside(folder, path)
                dest.parent.mkdir(parents=True, exist_ok=True)
                download.fetch(hub, name.repo_id, remote[path], dest, out)
        with editing(folder, Manifest.new(folder, name.repo_id, layout.runtime, mtype)) as manifest:
            manifest.data.update(runtime=layout.runtime, type=mtype)
            manifest.set_group(group, remote, {"kind": "hub", "endpoint": hub.endpoint, "revision": hub.revision})
    return precision


def _held(manifest, folder, remote):
    """True if the store already has exactly this file (same checksum, whole on disk)."""
    record = manifest.file_record(remote.path) if manifest else None
    if not record or (record["sha256"], record["git_oid"]) != (remote.sha256, remote.git_oid):
        return False
    try:
        return inside(folder, remote.path).stat().st_size == remote.size
    except OSError:
        return False


def _config(hub, repo_id, remote):
    """The repo's ``config.json`` as a dict, if it has a small one (used to spot VLMs)."""
    entry = remote.get("config.json")
    if entry is None or entry.size > MAX_CONFIG:
        return None
    try:
        return json.loads(hub.get_bytes(repo_id, "config.json", limit=MAX_CONFIG))
    except (HubError, ValueError) as e:
        log.debug("ignoring config.json of %s: %s", repo_id, e)
        return None
