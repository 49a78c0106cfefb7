"""`geniex list|ls [--format table|json|csv]`: the models in the store."""
import csv
import json
import sys

from geniex import config
from geniex.store import Store
from geniex.store.display import human_size

COLUMNS = ("name", "size", "runtime", "type", "precisions")


def register(sub):
    """Add the ``list`` parser (alias ``ls``)."""
    p = sub.add_parser("list", aliases=["ls"], help="list the models in the store")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table", help="output format (default: table)")
    p.set_defaults(func=run)


def run(args):
    store = Store(config.data_dir(getattr(args, "data_dir", None)))
    rows = store.list_models()
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow([*(row[c] for c in COLUMNS[:-1]), " ".join(row["precisions"])])
    else:
        print(f"Models cached in {store.models_dir}")
        _table(rows)
    return 0


def _table(rows):
    if not rows:
        print("(none yet; run `geniex pull ORG/REPO` to download one)")
        return
    cells = [("NAME", "PRECISIONS", "TYPE", "RUNTIME", "SIZE")]
    cells += [(r["name"], ", ".join(r["precisions"]), r["type"], r["runtime"], human_size(r["size"])) for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    for row in cells:
        print("  ".join(cell.ljust(w) if i < len(row) - 1 else cell.rjust(w)
                        for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
