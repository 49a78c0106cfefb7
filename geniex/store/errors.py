"""Store-specific failures; all are GenieXErrors, so the CLI prints them as one line."""
from geniex.errors import GenieXError


class HubError(GenieXError):
    """The Hub refused or failed a request (not found, gated, bad token, network)."""


class DownloadError(GenieXError):
    """A file could not be downloaded or written, or failed verification."""


class StoreError(GenieXError):
    """The store on disk cannot do what was asked (busy, bundled model, bad local path)."""


class HubUnreachable(HubError):
    """A failure worth retrying: the network, a timeout, a rate limit or a 5xx."""
