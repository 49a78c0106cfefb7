"""``geniex.json``: what the store holds of one model, written only when it is true.

A precision is added to the manifest only after all its files are verified and in
place, and removed from it before its files are deleted, so the manifest never names
a file that is not whole. ``list`` and ``resolve`` read manifests only; files no
manifest names are leftovers that ``clean`` deletes.

Shape (``format`` 1)::

    {"format": 1, "name": "org/repo", "runtime": "llama_cpp", "type": "llm",
     "precisions": {"Q4_0": {"files": ["m-Q4_0.gguf"], "mmproj": null, "mtp": [],
                             "draft": false, "source": {"kind": "hub", ...}}},
     "files": {"m-Q4_0.gguf": {"size": 123, "sha256": "...", "git_oid": null}}}
"""
import json
import os
import stat
from contextlib import contextmanager
from pathlib import PurePosixPath

from geniex import files
from geniex.errors import UsageError, shown
from geniex.store.classify import LLAMA_CPP, MODEL_TYPES, QAIRT, Group
from geniex.store.errors import StoreError
from geniex.store.locking import file_lock
from geniex.store.names import PRECISION, order_precisions, parse_name

MANIFEST = "geniex.json"
MANIFEST_LOCK = ".geniex.lock"  # held while the manifest is read, changed and written
# Held shared by every pull or registration writing into the folder, exclusive by
# `remove` and `clean`, so those never delete files a running pull is about to record.
PULL_LOCK = ".pull.lock"
LOCKS = (MANIFEST_LOCK, PULL_LOCK)
FORMAT = 1
MAX_MANIFEST = 16 << 20     # bytes; a real one is a few kB
# Names the store gives its own files next to a model's files (download.py's partial
# and lock files end in these): no file of a model may be called so.
PARTIAL_SUFFIX = ".partial"
LOCK_SUFFIX = ".lock"


class Manifest:
    """One model's manifest; ``folder`` is ``models/<org>/<repo>``."""

    def __init__(self, folder, data):
        self.folder = folder
        self.data = data

    @classmethod
    def new(cls, folder, name, runtime, model_type):
        return cls(folder, {"format": FORMAT, "name": name, "runtime": runtime, "type": model_type,
                            "precisions": {}, "files": {}})

    @classmethod
    def load(cls, folder):
        """The manifest in ``folder``, None if there is none; StoreError if it cannot be
        read (a FIFO, a symlink, too large, not JSON) or is not a whole manifest."""
        path = folder / MANIFEST
        try:
            data = json.loads(files.read_bounded(path, MAX_MANIFEST))
        except FileNotFoundError:
            return None
        except files.NotRegular as e:
            raise StoreError(f"{path} is {e.kind}, not a manifest; remove that folder and pull the model "
                             "again") from None
        except (OSError, ValueError) as e:
            raise StoreError(f"cannot read {path} ({e.strerror if isinstance(e, OSError) and e.strerror else e}); "
                             "remove that folder and pull the model again") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise StoreError(f"{path} is not a geniex manifest this version understands; remove that folder and pull again")
        problem = _problem(data)
        if problem:
            raise StoreError(f"{path} is damaged ({problem}); remove that folder and pull the model again")
        return cls(folder, data)

    def save(self):
        """Write atomically (temp file + rename); a manifest with no precision is deleted."""
        path = self.folder / MANIFEST
        if not self.data["precisions"]:
            path.unlink(missing_ok=True)
            return
        tmp = path.with_name(f"{MANIFEST}.tmp-{os.getpid()}")
        try:
            tmp.unlink(missing_ok=True)     # a leftover (or something planted): never written through
            with files.open_for_writing(tmp, exclusive=True) as f:
                f.write((json.dumps(self.data, indent=2, sort_keys=True) + "\n").encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            # A full disk (or a read-only one): the old manifest stays as it was, and
            # no half-written temp file is left behind.
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot write {path}: {e.strerror or e}; the store is unchanged "
                             "(free some space and try again)") from None

    name = property(lambda self: self.data["name"])
    runtime = property(lambda self: self.data["runtime"])
    type = property(lambda self: self.data["type"])

    @property
    def precisions(self):
        """All precisions held, drafts included, in preference order."""
        return order_precisions(self.data["precisions"])

    @property
    def listed_precisions(self):
        """Precisions shown by ``list``: MTP drafts are not standalone models."""
        return [p for p in self.precisions if not self.data["precisions"][p].get("draft")]

    def group(self, precision):
        """The Group of a held precision, or None."""
        entry = self.data["precisions"].get(precision)
        if entry is None:
            return None
        return Group(precision, list(entry["files"]), entry.get("mmproj"), list(entry.get("mtp", [])),
                     bool(entry.get("draft")))

    def size(self, precisions=None):
        """Bytes on disk of the files these precisions use (each file once); all if None."""
        paths = {f for p in precisions for f in self.group(p).all_files} if precisions else self.data["files"]
        return sum(self.data["files"][p]["size"] for p in paths)

    def set_group(self, group, files, source):
        """Record a precision whose files (``{path: RemoteFile}``) are all in place."""
        self.data["precisions"][group.precision] = {
            "files": group.files, "mmproj": group.mmproj, "mtp": group.mtp,
            "draft": group.draft, "source": source,
        }
        for path in group.all_files:
            remote = files[path]
            self.data["files"][path] = {"size": remote.size, "sha256": remote.sha256, "git_oid": remote.git_oid}

    def drop_group(self, precision):
        """Forget a precision; returns the files nothing else needs any more."""
        group = self.group(precision)
        del self.data["precisions"][precision]
        still_used = self.referenced()
        unused = [p for p in group.all_files if p not in still_used]
        for path in unused:
            self.data["files"].pop(path, None)
        return unused

    def referenced(self):
        """Every file path some held precision needs."""
        return {p for prec in self.data["precisions"] for p in self.group(prec).all_files}

    def file_record(self, path):
        return self.data["files"].get(path)


def inside(folder, relpath):
    """``folder / relpath`` (the whole path, whether or not it exists yet), refusing
    paths that would leave the folder: ``..``, absolute paths, backslashes, and a path
    through (or to) a symlink already on disk. A repo file may sit in subfolders
    (``Q4_K_M/m-00001-of-00003.gguf``); those not made yet are made by the writer."""
    # Split by hand: PurePosixPath would drop "." and empty parts ("a//b", "./b"), and a
    # file recorded under another spelling than its path on disk is one `clean` deletes.
    parts = relpath.split("/") if isinstance(relpath, str) and relpath else ()
    if not parts or relpath.startswith("/") or "\\" in relpath or any(p in ("..", ".", "") for p in parts):
        raise StoreError(f"refusing unsafe file path {shown(relpath)!r}")
    path = folder
    for i, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            break       # nor is anything below it on disk: nothing more to check
        except OSError as e:
            raise StoreError(f"cannot check {path}: {e.strerror or e}") from None
        if stat.S_ISLNK(mode):
            raise StoreError(f"{path} is a symlink; the store follows none (remove it, or `geniex clean`)")
        if i < len(parts) - 1 and not stat.S_ISDIR(mode):
            raise StoreError(f"{path} is not a folder; refusing the file path {shown(relpath)!r} "
                             "(remove it, or `geniex clean`)")
    return folder.joinpath(*parts)


def reserved(relpath, others=()):
    """Why a model file may not be called ``relpath`` (the store's own names: the
    manifest, its temp files, lock files, partial downloads, another file's ``.lock``),
    or None. ``others`` are the other files it is stored with."""
    name = PurePosixPath(relpath).name
    if name in (MANIFEST, *LOCKS) or name.startswith(f"{MANIFEST}.tmp"):
        return f"{name} is the name of the store's own {'manifest' if name.startswith(MANIFEST) else 'lock file'}"
    if name.endswith(PARTIAL_SUFFIX):
        return f"names ending in {PARTIAL_SUFFIX} are the store's partial downloads"
    if name.endswith(LOCK_SUFFIX) and relpath[:-len(LOCK_SUFFIX)] in others:
        return f"{relpath[:-len(LOCK_SUFFIX)]}{LOCK_SUFFIX} is the lock file of {relpath[:-len(LOCK_SUFFIX)]}"
    return None


def _problem(data):
    """What is wrong with a manifest's shape, or None (a damaged manifest is skipped, not
    a crash of every listing)."""
    def is_paths(value):
        return isinstance(value, list) and all(isinstance(p, str) and p for p in value)
    try:
        parse_name(data.get("name"))
    except (UsageError, TypeError, AttributeError):
        return "no model name"
    if data.get("runtime") not in (LLAMA_CPP, QAIRT) or data.get("type") not in MODEL_TYPES:
        return "no runtime or type"
    groups, records = data.get("precisions"), data.get("files")
    if not isinstance(groups, dict) or not isinstance(records, dict):
        return "no precisions or files"
    for path, record in records.items():
        if not isinstance(record, dict) or isinstance(record.get("size"), bool) or \
                not isinstance(record.get("size"), int) or record["size"] < 0:
            return f"the record of {shown(path)}"
    for precision, entry in groups.items():
        if not PRECISION.match(precision):
            return f"precision {shown(precision)!r}"
        if not isinstance(entry, dict) or not is_paths(entry.get("files")) or not entry["files"]:
            return f"the files of {shown(precision)}"
        if not (entry.get("mmproj") is None or isinstance(entry["mmproj"], str)) or \
                not is_paths(entry.get("mtp", [])):
            return f"the projector or drafts of {shown(precision)}"
        listed = [*entry["files"], *([entry["mmproj"]] if entry.get("mmproj") else []), *entry.get("mtp", [])]
        missing = [p for p in listed if p not in records]
        if missing:
            return f"{shown(missing[0])} has no record"
    return None


@contextmanager
def editing(folder, default=None):
    """Read-modify-write the manifest of ``folder`` under its lock.

    Yields the manifest on disk, else ``default`` (a ``Manifest.new(...)``, or None when
    there is nothing to create); saves what was yielded when the block ends normally.
    """
    with file_lock(folder / MANIFEST_LOCK):
        manifest = Manifest.load(folder) or default
        yield manifest
        if manifest is not None:
            manifest.save()
