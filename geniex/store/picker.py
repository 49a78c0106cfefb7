"""Choosing a precision when the user named none."""
import sys

from geniex.store.display import human_size, is_terminal


def choose_precision(repo_id, precisions, sizes, interactive=None, out=sys.stderr, ask=input):
    """The precision to pull from ``precisions`` (already in preference order).

    On a terminal, a numbered menu whose default (Enter) is the first entry; otherwise
    the first entry, with a line saying so. ``sizes`` maps precision -> bytes.
    """
    default = precisions[0]
    if interactive is None:
        interactive = is_terminal(sys.stdin) and is_terminal(out)
    if not interactive:
        others = f" (available: {', '.join(precisions)})" if len(precisions) > 1 else ""
        print(f"No precision given; pulling {repo_id}:{default}{others}. Add :PRECISION to the name to choose.",
              file=out, flush=True)
        return default
    if len(precisions) == 1:
        return default
    print(f"Precisions of {repo_id}:", file=out)
    width = max(len(p) for p in precisions)
    for i, precision in enumerate(precisions, 1):
        mark = "  (default)" if precision == default else ""
        print(f"  {i:>2}) {precision:<{width}}  {human_size(sizes[precision]):>9}{mark}", file=out)
    wanted = {p.upper(): p for p in precisions}
    while True:
        out.flush()
        try:
            answer = ask(f"Choose 1-{len(precisions)} or a name [{default}]: ").strip()
        except EOFError:
            return default
        if not answer:
            return default
        if answer.isdigit() and 1 <= int(answer) <= len(precisions):
            return precisions[int(answer) - 1]
        if answer.upper() in wanted:
            return wanted[answer.upper()]
        print(f"  not one of the choices: {answer!r}", file=out)

