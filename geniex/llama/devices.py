"""``--compute`` -> the list of ggml devices a model is loaded onto.

Devices are chosen by name and type through the ggml device API, so the same code
selects Hexagon NPUs (``HTP0``..``HTPn``, registered as GPU-type devices) on a
Snapdragon build and reports their absence clearly on a CPU-only build.
"""
import ctypes
from dataclasses import dataclass

from geniex.errors import UsageError
from geniex.llama import api

@dataclass(frozen=True)
class Device:
    """One ggml backend device."""

    name: str
    description: str
    type: int
    handle: int

    @property
    def is_npu(self):
        return self.name.upper().startswith("HTP")

    @property
    def is_cpu(self):
        return self.type == api.GGML_BACKEND_DEVICE_TYPE_CPU

    @property
    def is_gpu(self):
        return (self.type in (api.GGML_BACKEND_DEVICE_TYPE_GPU, api.GGML_BACKEND_DEVICE_TYPE_IGPU)
                and not self.is_npu)


def available(lib):
    """Every device the loaded library offers, in registry order."""
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        out.append(Device(
            name=(lib.ggml_backend_dev_name(dev) or b"").decode(),
            description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
            type=lib.ggml_backend_dev_type(dev),
            handle=dev,
        ))
    return out


def _describe(devices):
    return ", ".join(f"{d.name} ({d.description})" for d in devices) or "none"


def select(compute, devices, setting="--compute"):
    """Resolve a ``--compute`` value against ``devices``.

    Returns ``(chosen, why)``: the devices to pass (an empty list means CPU only) and a
    sentence for ``--verbose``. ``compute=None`` means: NPU when present, else a GPU,
    else the CPU. Raises UsageError when an explicit request cannot be met.
    """
    npus = [d for d in devices if d.is_npu]
    gpus = [d for d in devices if d.is_gpu]
    if compute is None or compute == "":
        if npus:
            return npus, "compute: npu (" + ", ".join(d.name for d in npus) + ") chosen by default"
        if gpus:
            return gpus[:1], f"compute: gpu ({gpus[0].name}) chosen by default (no NPU in this library)"
        return [], "compute: cpu chosen by default (the library has no NPU or GPU device)"
    key = compute.strip().lower()

    def need(found, what):
        if not found:
            raise UsageError(f"{setting} {compute}: the loaded llama.cpp library has no {what} device; "
                             f"it has: {_describe(devices)}")
        return found

    if key == "cpu":
        return [], "compute: cpu"
    if key == "npu":
        return need(npus, "NPU (HTP*)"), "compute: npu (" + ", ".join(d.name for d in npus) + ")"
    if key == "gpu":
        return need(gpus, "GPU")[:1], f"compute: gpu ({gpus[0].name})"
    if key == "hybrid":
        # GenieX's name for an NPU + CPU split. llama.cpp has no such device set: the CPU
        # is the host and runs every layer that is not offloaded, so the split is --ngl.
        raise UsageError(f"{setting} hybrid is not supported: llama.cpp runs the layers it does not offload "
                         "on the CPU, so an NPU + CPU split is --compute npu --ngl N (N layers on the NPU)")
    names = [n.strip() for n in compute.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{setting} {compute!r}: expected cpu, gpu, npu or a device list like HTP0,HTP1")
    by_name = {d.name.lower(): d for d in devices}
    unknown = [n for n in names if n.lower() not in by_name]
    if unknown:
        raise UsageError(f"{setting} {compute}: unknown device {', '.join(unknown)} "
                         f"(expected cpu, gpu, npu or device names); "
                         f"this library has: {_describe(devices)}")
    chosen = [by_name[n.lower()] for n in names]
    return chosen, "compute: " + ", ".join(d.name for d in chosen)


def null_terminated(chosen):
    """A ``ggml_backend_dev_t[]`` for ``llama_model_params.devices`` (keep it alive)."""
    # The CPU is always the host backend; listing it as an offload target is not wanted.
    handles = [d.handle for d in chosen if not d.is_cpu]
    arr = (ctypes.c_void_p * (len(handles) + 1))(*handles, None)
    return arr


def chosen_names(compute, lib=None, setting="compute"):
    """The device names ``--compute`` resolves to (``("CPU",)`` for CPU only): what two
    load requests must agree on to share a loaded model, whatever they spelled."""
    from geniex.llama import library
    chosen, _ = select(compute, available(lib or library.load()), setting)
    return tuple(d.name for d in chosen) or ("CPU",)


TYPE_NAMES = {api.GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", api.GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
              api.GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu", api.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel"}


def report(lib):
    """What the loaded library is made of, as a dict (for ``geniex devices``):

    ``files``: each opened file and how many declared functions were bound from it;
    ``backends``: each registered ggml backend and its device count; ``devices``: each
    device with its backend and kind (``npu`` for Hexagon ``HTP*``); ``backend_files``:
    backend libraries present beside a folder build (``ggml-hexagon.dll`` ...), which
    ggml loads when their hardware and drivers are usable.
    """
    from geniex.llama import library
    out = {
        "library": str(lib.path),
        "found_via": lib.source,
        "build": f"b{library.EXPECTED_BUILD}",
        "files": [{"path": str(f.path), "functions": len(f.functions)} for f in lib.files],
        "backends": [],
        "devices": [],
        "backend_files": [],
        "missing_optional": sorted(lib._missing.values()),
    }
    registry = lib.has("ggml_backend_reg_count") and lib.has("ggml_backend_reg_get") and lib.has("ggml_backend_reg_name")
    if registry:
        for i in range(lib.ggml_backend_reg_count()):
            reg = lib.ggml_backend_reg_get(i)
            count = lib.ggml_backend_reg_dev_count(reg) if lib.has("ggml_backend_reg_dev_count") else None
            out["backends"].append({"name": _text(lib.ggml_backend_reg_name(reg)), "devices": count})
    for d in available(lib):
        backend = None
        if registry and lib.has("ggml_backend_dev_backend_reg"):
            reg = lib.ggml_backend_dev_backend_reg(d.handle)
            backend = _text(lib.ggml_backend_reg_name(reg)) if reg else None
        kind = "npu" if d.is_npu else TYPE_NAMES.get(d.type, str(d.type))
        out["devices"].append({"name": d.name, "description": d.description, "kind": kind, "backend": backend})
    if lib.source != library.WHEEL_SOURCE:
        mine = {f.path.name for f in lib.files}
        for pattern in library.file_names("ggml-*"):
            for p in sorted(lib.path.parent.glob(pattern)):
                if p.name not in mine and p.name not in out["backend_files"]:
                    out["backend_files"].append(p.name)
    return out


def _text(raw):
    return (raw or b"").decode("utf-8", "replace")


def format_report(rep):
    """``report()`` as the lines ``geniex devices`` prints."""
    lines = [f"llama.cpp library: {rep['library']} (build {rep['build']}, found via {rep['found_via']})",
             "files loaded:"]
    lines += [f"  {f['path']}  ({f['functions']} functions bound from it)" for f in rep["files"]]
    if rep["backend_files"]:
        lines.append("backend files beside it: " + ", ".join(rep["backend_files"]))
    if rep["backends"]:
        lines.append("backends: " + ", ".join(
            b["name"] + (f" ({b['devices']} device{'s' if b['devices'] != 1 else ''})" if b["devices"] is not None else "")
            for b in rep["backends"]))
    lines.append("devices:")
    for d in rep["devices"]:
        via = f", backend {d['backend']}" if d["backend"] else ""
        lines.append(f"  {d['name']:<12} {d['kind']:<5} {d['description']}{via}")
    if not rep["devices"]:
        lines.append("  (none)")
    if not any(d["kind"] == "npu" for d in rep["devices"]):
        lines.append("no NPU (Hexagon HTP*) device: --compute npu is unavailable with this library")
    return lines
