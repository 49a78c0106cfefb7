"""`geniex serve` (placeholder until its module lands)."""


def register(sub):
    """Add the verb's parser."""
    p = sub.add_parser("serve", help="(not yet available)")
    p.set_defaults(func=lambda args: print("serve: not yet available") or 1)
