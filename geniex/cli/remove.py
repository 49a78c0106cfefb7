"""`geniex remove|rm <name>[:<precision>]... [-y]`: delete models or single precisions."""
import sys

from geniex import config
from geniex.errors import GenieXError
from geniex.store import Store
from geniex.store.display import human_size, is_terminal


def register(sub):
    """Add the ``remove`` parser (alias ``rm``)."""
    p = sub.add_parser("remove", aliases=["rm"], help="remove models (or one precision) from the store")
    p.add_argument("names", nargs="+", metavar="ORG/REPO[:PRECISION]",
                   help="with a precision, only that quant; without, the whole model")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=run)


def run(args):
    store = Store(config.data_dir(getattr(args, "data_dir", None)))
    failed = None
    for name in args.names:
        try:
            labels, size = store.removal_preview(name)
            if not args.yes and is_terminal(sys.stdin) and not _confirm(f"Remove {', '.join(labels)} ({human_size(size)})?"):
                print(f"kept {name}")
                continue
            store.remove(name)
            print(f"removed {', '.join(labels)} ({human_size(size)})")
        except GenieXError as e:
            # Keep going through the other names; report each failure on its own line.
            print(f"error: {e}", file=sys.stderr)
            failed = failed or e
    return failed.exit_code if failed else 0


def _confirm(question):
    try:
        return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
    except EOFError:
        return False
