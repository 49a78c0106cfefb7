"""``pull --local-path``: register GGUF files already on disk.

Files are hard-linked into the store when the store is on the same filesystem (no
extra space, and the store copy survives the original being deleted), else copied.
Either way they are hashed, so the manifest records the same facts as for a download.
"""
import errno
import json
import os
import shutil
from pathlib import Path

from tqdm import tqdm

from geniex import files
from geniex.errors import ModelLoadError, ModelNotFound
from geniex.llama.gguf_file import read_header, shard_files
from geniex.store import classify
from geniex.store.checksums import sha256_of
from geniex.store.display import human_size, is_terminal
from geniex.store.errors import DownloadError, StoreError
from geniex.store.hub import RemoteFile
from geniex.store.locking import file_lock
from geniex.store.manifest import PULL_LOCK, Manifest, editing, inside
from geniex.store.names import precision_of, shard_of
from geniex.store.picker import choose_precision

# Link failures that mean "this filesystem cannot hard-link here": copy instead.
# (EINVAL: Windows reports a filesystem without hard links, such as FAT, that way.)
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES, errno.EINVAL}
MAX_CONFIG = 1 << 20


def register_local(folder, name, source, model_type=None, out=None, interactive=None):
    """Store the GGUFs at ``source`` (a file or folder) as ``name``; returns the precision."""
    source = Path(os.path.abspath(Path(source).expanduser()))
    root, paths = _gguf_files(source)
    layout = classify.plan(paths, detect=lambda p: precision_of(p) or header_precision(root / p))
    if not layout.groups:
        raise StoreError(f"{source} holds only mmproj projector files, no model to register")
    if source.is_file() and name.precision:
        # One file: the user's precision names it, but it must be what the file holds.
        _check_precision(source, name)
        (group,) = layout.groups.values()
        group.precision = name.precision
        layout.groups = {name.precision: group}
    precisions = layout.precisions
    sizes = {p: sum((root / f).stat().st_size for f in layout.groups[p].all_files) for p in precisions}
    precision = name.precision or choose_precision(name.repo_id, precisions, sizes, interactive, out)
    if precision not in layout.groups:
        raise ModelNotFound(f"{source} has no precision {precision}; it has: {', '.join(precisions)}")
    group = layout.groups[precision]
    for unit in (group.files, group.mtp, [group.mmproj] if group.mmproj else []):
        if unit:
            _check_unit(root, unit)
    config = _read_json(root / "config.json") if source.is_dir() else None
    mtype = classify.model_type(model_type, config, layout.has_mmproj)

    records, ways = {}, set()
    with file_lock(folder / PULL_LOCK, shared=True):
        if _already_held(folder, root, group, precision):
            print(f"{name.repo_id}:{precision} from {source} is already present in the store; nothing to do",
                  file=out)
            return precision, True
        for path in group.all_files:
            dest = inside(folder, path)
            ways.add(_place(root / path, dest, out))
            records[path] = RemoteFile(path, dest.stat().st_size, sha256=_hash(dest, out))
        how = "copied" if "copied" in ways else "linked (hard link, no extra disk space)"
        with editing(folder, Manifest.new(folder, name.repo_id, classify.LLAMA_CPP, mtype)) as manifest:
            manifest.data["type"] = mtype
            manifest.set_group(group, records, {"kind": "local", "path": str(source), "how": how.split()[0]})
    print(f"{how}: {len(group.all_files)} file(s) from {source}", file=out)
    return precision, False


def _check_unit(root, unit):
    """Check one model (a file, or a split model's shards) as a load would check it
    (bounded, before any library sees it): a model llama.cpp could not load is refused
    now rather than stored. A split model is checked through its first shard, which holds
    all the metadata: ``read_header`` reads the other shards from it and checks that
    each is that shard of that split. Any other file in ``unit`` is not part of it."""
    first = root / unit[0]
    shard = shard_of(first.name)
    if shard and shard[0] != 1:
        raise StoreError(f"{first} is shard {shard[0]} of a split model, but its first shard "
                         f"(-00001-of-{shard[1]:05d}.gguf), which holds the model's metadata, is not beside it")
    files = shard_files(read_header(first))
    stray = [path for path in unit if root / path not in files]
    if stray:
        what = f"split into {len(files)} files (its split.count)" if len(files) > 1 else "one whole file"
        raise StoreError(f"{root / stray[0]} is not part of the model in {first.name}, which is {what}; "
                         "move it out of the folder, or get the shards of one conversion")


def _check_precision(source, name):
    """Refuse ``NAME:P --local-path FILE`` when FILE is not precision P: the GGUF
    header's ``general.file_type`` decides, else the precision in its file name."""
    declared = header_precision(source)
    how = "its GGUF header (general.file_type)"
    if declared is None:
        declared, how = precision_of(source.name), "its file name"
    if declared is not None and declared.upper() != name.precision.upper():
        raise StoreError(f"{source.name} is {declared} according to {how}, not {name.precision}; "
                         f"pull it as {name.repo_id}:{declared} (or without a precision)")


def _already_held(folder, root, group, precision):
    """True if the manifest already records ``precision`` with exactly these files,
    each in place (the same file, hard-linked, or a copy of the same size and hash)."""
    manifest = Manifest.load(folder)
    held = manifest.group(precision) if manifest else None
    if held is None or sorted(held.all_files) != sorted(group.all_files):
        return False
    for path in group.all_files:
        src, dest, record = root / path, inside(folder, path), manifest.file_record(path)
        try:
            if not dest.is_file() or record is None:
                return False
            if os.path.samefile(src, dest):
                continue
            if src.stat().st_size != record["size"] or sha256_of(src, follow_symlinks=True) != record["sha256"]:
                return False
        except OSError:
            return False
    return True


def header_precision(path):
    """The precision a GGUF's header declares (``general.file_type``), or None. Read
    with our bounded reader: gguf-py's reads whatever lengths a file claims."""
    try:
        file_type = read_header(path, check_model=False).metadata.get("general.file_type")
    except ModelLoadError:
        return None          # unreadable just means "unknown" here; the file name may say
    if isinstance(file_type, bool) or not isinstance(file_type, int):
        return None
    from gguf import LlamaFileType
    try:
        return LlamaFileType(file_type).name.replace("MOSTLY_", "").replace("ALL_", "")
    except ValueError:
        return None


def _gguf_files(source):
    """(root folder, GGUF paths relative to it) for a file or a folder."""
    if source.is_file():
        if not classify.is_gguf(source.name):
            raise StoreError(f"{source} is not a .gguf file")
        return source.parent, [source.name]
    if source.is_dir():
        paths = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file() and classify.is_gguf(p.name))
        if not paths:
            raise StoreError(f"no .gguf files in {source}")
        return source, paths
    raise StoreError(f"no such file or folder: {source}")


def _place(src, dest, out):
    """Hard-link ``src`` to ``dest``, or copy it if linking is impossible; says which."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and os.path.samefile(src, dest):
        return "linked"
    tmp = dest.with_name(dest.name + ".partial")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
        way = "linked"
    except OSError as e:
        if e.errno not in _NO_LINK:
            raise StoreError(f"cannot link {src} into the store: {e.strerror}") from None
        _copy(src, tmp, out)
        way = "copied"
    try:
        os.replace(tmp, dest)
    except PermissionError:
        tmp.unlink(missing_ok=True)
        raise StoreError(f"cannot replace {dest}: another process has it open (on Windows, a model "
                         f"being served or run cannot be replaced); stop that process and pull again") from None
    return way


def _copy(src, tmp, out):
    size = src.stat().st_size
    with tqdm(total=size, unit="B", unit_scale=True, desc=f"copy {src.name}",
              file=out, disable=not is_terminal(out)) as bar:
        try:
            with files.open_regular(src) as fin, files.open_for_writing(tmp, exclusive=True) as fout:
                while block := fin.read(1 << 20):
                    fout.write(block)
                    bar.update(len(block))
                fout.flush()
                os.fsync(fout.fileno())
            shutil.copystat(src, tmp)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if e.errno == errno.ENOSPC:
                raise DownloadError(f"disk full while copying {src} ({human_size(size)}) into the store") from None
            raise StoreError(f"cannot copy {src} into the store: {e.strerror}") from None


def _hash(path, out):
    with tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
              desc=f"sha256 {path.name}", file=out, disable=not is_terminal(out)) as bar:
        return sha256_of(path, bar.update)


def _read_json(path):
    # A config.json of the user's folder: at most MAX_CONFIG bytes, never a FIFO.
    try:
        return json.loads(files.read_bounded(path, MAX_CONFIG, follow_symlinks=True))
    except (OSError, ValueError):
        return None
