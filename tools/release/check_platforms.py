"""Check with pip's resolver that ``pip install geniex`` works on every platform we
support, using wheels only (users' machines have no compilers).

For each platform this runs, in a subprocess::

    pip install --dry-run --ignore-installed --only-binary=:all: \\
        --platform TAG --python-version 3.12 --target TMP --report REPORT .

pip picks wheels for ``--platform`` but evaluates environment markers (such as the
``sys_platform`` marker on ``xllamacpp`` in setup.cfg) against the machine it runs on.
To resolve as the target would, the subprocess replaces the marker environment of pip's
vendored ``packaging`` with the target's (``sys_platform``, ``platform_machine``, ...)
before pip starts, so every marker, ours and our dependencies', is evaluated for the
target. Fails (exit 1) if any platform does not resolve, or if a platform that should
get the bundled library (``xllamacpp``) does not, or one that should not does.

Usage: python tools/release/check_platforms.py [--python-version 3.12] [platform ...]
Needs network access to the package index; installs nothing.
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name -> (pip --platform tags, marker environment, whether xllamacpp is expected)
PLATFORMS = {
    "win_arm64": (["win_arm64"],
                  dict(sys_platform="win32", platform_system="Windows", os_name="nt",
                       platform_machine="ARM64"), False),
    "win_amd64": (["win_amd64"],
                  dict(sys_platform="win32", platform_system="Windows", os_name="nt",
                       platform_machine="AMD64"), False),
    # The xllamacpp macOS wheel is tagged macosx_13_0_arm64: pip accepts it for 14.0.
    "macos_arm64": (["macosx_14_0_arm64"],
                    dict(sys_platform="darwin", platform_system="Darwin", os_name="posix",
                         platform_machine="arm64"), True),
    "linux_x86_64": (["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"],
                     dict(sys_platform="linux", platform_system="Linux", os_name="posix",
                          platform_machine="x86_64"), True),
    "linux_aarch64": (["manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"],
                      dict(sys_platform="linux", platform_system="Linux", os_name="posix",
                           platform_machine="aarch64"), True),
}

# Runs inside the pip subprocess: swap the marker environment, then run pip's main.
_SHIM = """
import json, sys
env = json.loads(sys.argv[1])
import pip._vendor.packaging.markers as markers
base = markers.default_environment
if not callable(base):
    raise SystemExit("pip's vendored packaging has no default_environment(); update tools/release/check_platforms.py")
markers.default_environment = lambda: {**base(), **env}
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def marker_env(platform, python_version):
    """The full marker environment for one target."""
    env = dict(PLATFORMS[platform][1])
    env.update(python_version=python_version, python_full_version=python_version + ".0",
               implementation_name="cpython", platform_python_implementation="CPython")
    return env


def resolve(platform, python_version, project=ROOT):
    """Resolve ``project`` for ``platform``; returns ``(ok, packages or error text)``."""
    tags, _, _ = PLATFORMS[platform]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-c", _SHIM, json.dumps(marker_env(platform, python_version)),
               "install", "--dry-run", "--ignore-installed", "--only-binary=:all:",
               "--python-version", python_version, "--target", str(Path(tmp) / "target"),
               "--report", str(report), "--quiet", "--disable-pip-version-check"]
        for tag in tags:
            cmd += ["--platform", tag]
        cmd.append(str(project))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not report.exists():
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.startswith("ERROR")]
            return False, "\n".join(lines) or proc.stderr.strip()[-2000:]
        data = json.loads(report.read_text(encoding="utf-8"))
    return True, {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in data["install"]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("platforms", nargs="*", metavar="platform",
                        help=f"default: all of {', '.join(PLATFORMS)}")
    parser.add_argument("--python-version", default="3.12")
    args = parser.parse_args(argv)
    unknown = [p for p in args.platforms if p not in PLATFORMS]
    if unknown:
        parser.error(f"unknown platform {', '.join(unknown)}; expected: {', '.join(PLATFORMS)}")
    failed = []
    for platform in args.platforms or PLATFORMS:
        ok, result = resolve(platform, args.python_version)
        want_lib = PLATFORMS[platform][2]
        if ok:
            has_lib = "xllamacpp" in result
            if has_lib != want_lib:
                ok, result = False, (f"xllamacpp {'resolved' if has_lib else 'missing'}, expected "
                                     f"{'it' if want_lib else 'no xllamacpp'} on this platform")
        if ok:
            lib = f"xllamacpp {result['xllamacpp']}" if want_lib else "no bundled library (bring your own llama.cpp)"
            print(f"ok    {platform:14} {len(result)} packages, {lib}")
        else:
            failed.append(platform)
            print(f"FAIL  {platform:14} {result}")
    if failed:
        print(f"pip install does not resolve on: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
