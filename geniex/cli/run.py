"""`geniex run` (placeholder until its module lands)."""


def register(sub):
    """Add the verb's parser."""
    p = sub.add_parser("run", help="(not yet available)")
    p.set_defaults(func=lambda args: print("run: not yet available") or 1)
