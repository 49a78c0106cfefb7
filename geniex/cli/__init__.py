"""Command-line entry point: global flags, then one module per verb.

Each verb module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (called with the parsed namespace, returns an exit code). Verb modules parse,
call the layers below and print; they hold no generation or storage logic.
"""
import argparse
import importlib
import logging
import sys

from geniex import __version__
from geniex.errors import GenieXError

VERBS = ["pull", "list", "remove", "clean", "infer", "serve", "run", "devices"]

log = logging.getLogger("geniex")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One clear line and exit 2, like argparse, but without the full usage dump.
        self.exit(2, f"{self.prog}: error: {message}\n(see '{self.prog} --help')\n")


def _version_text():
    """The version, then the devices report (or why no library could be loaded)."""
    import platform
    lines = [f"geniex {__version__} (Python {platform.python_version()}, {sys.platform} {platform.machine()})"]
    try:
        from geniex.llama import devices, library
        lib = library.load()
        lines += devices.format_report(devices.report(lib))
        lines.append(f"system info: {lib.system_info()}")
    except GenieXError as e:
        lines.append(f"llama.cpp library: not loaded ({e})")
    return "\n".join(lines)


def _safe_console():
    """Never crash on a console that cannot show a character (a Windows console on a
    legacy code page, ``PYTHONIOENCODING=ascii``, a pipe with a C locale): write what
    it can and a replacement for the rest."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (stream.errors or "strict") == "strict":
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):
                pass


def build_parser():
    """The full argparse tree (global flags plus every verb)."""
    parser = _Parser(prog="geniex", description="Run local LLMs with speculative decoding.")
    parser.add_argument("--data-dir", help="store root (env GENIEX_DATADIR; default ~/.cache/geniex on Linux, ~/Library/Caches/geniex on macOS, %%LOCALAPPDATA%%\\geniex on Windows)")
    parser.add_argument("--log", metavar="LEVEL", help="none|error|warn|info|debug|trace (env GENIEX_LOG); shows llama.cpp's own log too")
    parser.add_argument("--verbose", "-v", action="store_true", help="more detail (profiling block, device choice)")
    parser.add_argument("--version", action="store_true", help="print the version and the loaded llama.cpp library")
    sub = parser.add_subparsers(dest="verb", metavar="COMMAND", parser_class=_Parser)
    for verb in VERBS:
        importlib.import_module(f"geniex.cli.{verb}").register(sub)
    # Accept the global flags after the verb too (`geniex infer -p hi --verbose`);
    # SUPPRESS keeps a value given before the verb from being overwritten.
    seen = set()
    for verb_parser in sub.choices.values():
        if id(verb_parser) in seen:
            continue
        seen.add(id(verb_parser))
        verb_parser.add_argument("--data-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        verb_parser.add_argument("--log", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        verb_parser.add_argument("--verbose", "-v", action="store_true", default=argparse.SUPPRESS, help="more detail")
        verb_parser.add_argument("--version", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def main(argv=None):
    """Run the CLI; returns the process exit code."""
    _safe_console()
    parser = build_parser()
    # Not list(argv): importing the verb modules binds geniex.cli.list (the `list` verb)
    # in this module's namespace, where it shadows the builtin.
    argv = sys.argv[1:] if argv is None else [*argv]
    flags = argv[:argv.index("--")] if "--" in argv else argv
    if "--version" in flags and "-h" not in flags and "--help" not in flags:
        # Anywhere on the line (`geniex pull --version`), even where the verb's own
        # required arguments are missing.
        try:
            from geniex import log as logsetup
            logsetup.setup(None, False)
        except GenieXError:
            pass
        print(_version_text())
        return 0
    args = parser.parse_args(argv)
    try:
        from geniex import log as logsetup
        logsetup.setup(args.log, args.verbose)
        if args.version:
            print(_version_text())
            return 0
        if not args.verb:
            parser.print_help()
            return 2
        return args.func(args) or 0
    except GenieXError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
