"""`geniex devices [--format text|json]`: which llama.cpp files were loaded from where,
and which backends and devices they provide (``--compute`` chooses among these)."""
import json

from geniex.llama import devices, library


def register(sub):
    """Add the ``devices`` parser."""
    p = sub.add_parser("devices", help="show the loaded llama.cpp library, its backends and devices")
    p.add_argument("--format", choices=["text", "json"], default="text", help="output format (default: text)")
    p.set_defaults(func=run)


def run(args):
    rep = devices.report(library.load())
    if args.format == "json":
        print(json.dumps(rep, indent=2))
    else:
        print("\n".join(devices.format_report(rep)))
    return 0
