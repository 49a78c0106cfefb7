"""Which ``xllamacpp`` wheels carry a usable llama.cpp C API: download the wheel for each
platform and read its binary's export (PE) / dynamic symbol (ELF) / symbol (Mach-O)
table, then check every function geniex declares (``geniex/llama/api.py``).

This is how the environment markers on ``xllamacpp`` in setup.cfg were chosen. It is a
maintainer's tool, not part of geniex: it needs ``lief`` (``pip install lief``), a
pure-Python-installable reader for all three formats, and network access to PyPI.

Usage: python tools/release/wheel_exports.py [--version 2026.10.11549] [--keep DIR]

Result for 2026.10.11549 (2026-11-30):
  win_arm64      no wheel
  win_amd64      xllamacpp.pyd: 1 export (PyInit_xllamacpp), 0 llama_*
  macos_arm64    xllamacpp.abi3.so: 252 llama_*, all geniex functions present
  linux_x86_64   xllamacpp.abi3.so: 252 llama_*, all geniex functions present
  linux_aarch64  xllamacpp.abi3.so: 252 llama_*, all geniex functions present
"""
import argparse
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from geniex.llama import api  # noqa: E402

PLATFORMS = {
    "win_arm64": "win_arm64",
    "win_amd64": "win_amd64",
    "macos_arm64": "macosx_14_0_arm64",
    "linux_x86_64": "manylinux_2_17_x86_64",
    "linux_aarch64": "manylinux_2_17_aarch64",
}


def exported(path):
    """The set of symbol names ``path`` exports (Mach-O's leading underscore dropped)."""
    import lief
    binary = lief.parse(str(path))
    if isinstance(binary, lief.PE.Binary):
        return {e.name for e in binary.get_export().entries} if binary.has_exports else set()
    if isinstance(binary, lief.ELF.Binary):
        return {s.name for s in binary.dynamic_symbols if s.exported}
    return {s.name[1:] for s in binary.exported_symbols if s.name.startswith("_")}


def wanted():
    return ([*api.FUNCTIONS], [*api.OPTIONAL_FUNCTIONS, *(s for s, _, _ in api.MANGLED_FUNCTIONS.values())])


def check(platform_tag, version, work):
    dest = work / platform_tag
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                           "--platform", platform_tag, "--python-version", "3.12",
                           f"xllamacpp=={version}", "-d", str(dest), "--quiet"], capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl")) if dest.exists() else []
    if proc.returncode != 0 or not wheels:
        return "no wheel"
    with zipfile.ZipFile(wheels[0]) as zf:
        members = [m for m in zf.namelist() if m.startswith("xllamacpp/xllamacpp") and
                   m.endswith((".so", ".pyd", ".dylib"))]
        zf.extractall(dest / "x", members)
    binary = dest / "x" / members[0]
    names = exported(binary)
    llama = sorted(n for n in names if n.startswith("llama_"))
    required, optional = wanted()
    missing = [n for n in required if n not in names]
    missing_opt = [n for n in optional if n not in names]
    head = f"{binary.name}: {len(names)} exports, {len(llama)} llama_*"
    if not llama:
        return head + f" ({', '.join(sorted(names)[:3])})"
    if missing:
        return head + f", MISSING required: {', '.join(missing)}"
    return head + (", all geniex functions present" if not missing_opt else
                   f", optional missing: {', '.join(missing_opt)}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="2026.10.11549")
    parser.add_argument("--keep", type=Path, help="keep the downloaded wheels here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        for name, tag in PLATFORMS.items():
            print(f"{name:14} {check(tag, args.version, work)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
