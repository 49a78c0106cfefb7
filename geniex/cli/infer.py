"""`geniex infer` (placeholder until its module lands)."""


def register(sub):
    """Add the verb's parser."""
    p = sub.add_parser("infer", help="(not yet available)")
    p.set_defaults(func=lambda args: print("infer: not yet available") or 1)
