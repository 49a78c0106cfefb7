"""The C boundary: loading and checking the library, devices, GGUF headers."""
import os
import subprocess
import sys

import pytest

from geniex.errors import ModelLoadError, UsageError
from geniex.llama import devices, library
from geniex.llama.gguf_file import read_header


def test_library_loads_and_reports_itself():
    lib = library.load()
    assert lib.path.exists()
    assert "CPU" in lib.system_info() or "AVX" in lib.system_info()
    # The MTP staging API is exported under C++-mangled names and bound.
    assert lib.has("llama_set_embeddings_nextn") and lib.has("llama_get_embeddings_nextn_ith")


def test_missing_capability_is_reported_not_crashed():
    lib = library.load()
    lib._missing["llama_fake_fn"] = "_Zfake"
    with pytest.raises(Exception) as e:
        lib.require("llama_fake_fn", capability="a fake feature")
    assert "a fake feature" in str(e.value) and "_Zfake" in str(e.value)


def _load_in_subprocess(env):
    code = "from geniex.llama import library\ntry:\n    library.load()\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


def test_a_library_with_another_abi_is_refused(tmp_path):
    # Python's own _ctypes extension is a real shared object on every platform (no path
    # to guess per architecture) but not llama.cpp: it lacks the required symbols.
    import _ctypes
    path = _ctypes.__file__
    proc = _load_in_subprocess({"GENIEX_LLAMA_LIB": path})
    assert "LibraryError" in proc.stdout and "b11549" in proc.stdout and path in proc.stdout


def test_library_search_order_env_then_lib_dir_then_wheel(tmp_path):
    proc = _load_in_subprocess({"GENIEX_LLAMA_LIB": str(tmp_path / "nope.so")})
    assert "does not exist" in proc.stdout
    (tmp_path / "libllama.so").write_bytes(b"not a library")
    proc = _load_in_subprocess({"GENIEX_LIB_DIR": str(tmp_path)})
    assert "cannot load the llama.cpp library" in proc.stdout and str(tmp_path) in proc.stdout
    labels = [src for src, _ in library.candidates()]
    assert labels.index("lib/") < labels.index("xllamacpp wheel")


def _devs(*spec):
    return [devices.Device(name, name + " device", kind, i + 1) for i, (name, kind) in enumerate(spec)]


# A Hexagon NPU cannot exist on this machine: these device lists stand in for a
# Snapdragon build's registry (names and types as that build reports them).
SNAPDRAGON = _devs(("CPU", 0), ("GPUOpenCL", 1), ("HTP0", 1), ("HTP1", 1))


def test_compute_selection_by_name_and_type():
    names = lambda sel: [d.name for d in sel[0]]
    assert names(devices.select("npu", SNAPDRAGON)) == ["HTP0", "HTP1"]
    assert names(devices.select("gpu", SNAPDRAGON)) == ["GPUOpenCL"]
    with pytest.raises(UsageError, match="hybrid is not supported.*--compute npu --ngl N"):
        devices.select("hybrid", SNAPDRAGON)   # llama.cpp has no NPU + CPU device set: the split is --ngl
    assert names(devices.select("HTP1", SNAPDRAGON)) == ["HTP1"]
    assert names(devices.select("htp0,HTP1", SNAPDRAGON)) == ["HTP0", "HTP1"]
    assert names(devices.select("cpu", SNAPDRAGON)) == []
    assert names(devices.select(None, SNAPDRAGON)) == ["HTP0", "HTP1"]      # default: NPU first
    assert names(devices.select(None, _devs(("CPU", 0), ("GPUOpenCL", 1)))) == ["GPUOpenCL"]
    assert names(devices.select(None, _devs(("CPU", 0)))) == []


def test_unmet_compute_request_lists_available_devices():
    real = devices.available(library.load())
    assert [d.name for d in real] == ["CPU"]
    for value in ("npu", "gpu", "HTP0", "banana"):
        with pytest.raises(UsageError) as e:
            devices.select(value, real)
        assert "CPU" in str(e.value)


def test_device_list_is_null_terminated_without_cpu():
    arr = devices.null_terminated(SNAPDRAGON)
    assert list(arr) == [2, 3, 4, None]    # the CPU is the host, never an offload target


def test_gguf_header_of_demo_model(demo_model):
    h = read_header(demo_model)
    assert h.architecture == "llama" and h.arch_key("embedding_length") == 576
    assert int(h.metadata["tokenizer.ggml.tokens"]) == 49152


def test_bad_gguf_files_are_caught_before_the_library(tmp_path, demo_model):
    with pytest.raises(ModelLoadError, match="no such model file"):
        read_header(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(ModelLoadError, match="not a GGUF"):
        read_header(tmp_path / "text.gguf")
    data = demo_model.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated"):
        read_header(tmp_path / "cut.gguf")
    (tmp_path / "header-cut.gguf").write_bytes(data[:5000])
    with pytest.raises(ModelLoadError, match="truncated"):
        read_header(tmp_path / "header-cut.gguf")
