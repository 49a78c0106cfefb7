"""KV cache types by the names llama.cpp's ``-ctk/-ctv`` accept."""
from geniex.errors import UsageError

# ggml_type ids (ggml.h) of the types llama.cpp allows for the K and V caches.
CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q4_0": 2, "q4_1": 3,
               "iq4_nl": 20, "q5_0": 6, "q5_1": 7}


def ggml_type(name):
    """The ggml type id of a cache type name; UsageError for an unknown name."""
    try:
        return CACHE_TYPES[str(name).lower()]
    except KeyError:
        raise UsageError(f"unknown KV cache type {name!r} (known: {', '.join(CACHE_TYPES)})") from None
