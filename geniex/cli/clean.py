"""`geniex clean [-y]`: delete partial downloads and files no model uses."""
import sys

from geniex import config
from geniex.store import Store
from geniex.store.display import is_terminal


def register(sub):
    """Add the ``clean`` parser."""
    p = sub.add_parser("clean", help="delete partial downloads and orphaned files from the store")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=run)


def run(args):
    store = Store(config.data_dir(getattr(args, "data_dir", None)))
    doomed = store.clean(dry_run=True)
    if not doomed:
        print(f"nothing to clean in {store.models_dir}")
        return 0
    for path in doomed:
        print(f"  {path}")
    if not args.yes and is_terminal(sys.stdin):
        try:
            answer = input(f"Delete these {len(doomed)} item(s)? [y/N] ").strip().lower()
        except EOFError:
            answer = ""
        if answer not in ("y", "yes"):
            print("nothing deleted")
            return 0
    removed = store.clean()
    print(f"deleted {len(removed)} item(s)")
    return 0
