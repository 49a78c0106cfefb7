"""How the store shows things to people: byte counts, and whether a stream is a terminal."""


def human_size(n):
    """``98362432`` -> ``"98.4 MB"`` (decimal units, like the Hub's web pages)."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000


def is_terminal(stream):
    """True if ``stream`` is an interactive terminal (progress bars, menus, prompts)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
