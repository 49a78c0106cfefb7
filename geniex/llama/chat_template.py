"""llama.cpp's built-in chat formats (``llama_chat_apply_template``).

The library recognises the common template families from the template text (chatml,
llama-2/3, gemma, phi, mistral, ...) and formats messages with its own C++ code; given
no template it uses chatml. geniex renders the model's own Jinja template first
(:mod:`geniex.engine.template`) and uses this only for a model without a template or a
template Jinja cannot render.
"""
import ctypes

from geniex.llama import api, library


def apply_builtin(template, messages, add_assistant=True):
    """Format ``messages`` (``{"role", "content"}`` dicts with text content) with the
    library's built-in format for ``template`` (None = chatml). Returns the prompt
    text, or None when the library does not recognise the template."""
    lib = library.load()
    keep = [(str(m.get("role") or "").encode(), str(m.get("content") or "").encode()) for m in messages]
    arr = (api.llama_chat_message * max(1, len(keep)))(*[api.llama_chat_message(r, c) for r, c in keep])
    tmpl = template.encode() if template else None
    size = 4096 + sum(len(r) + len(c) for r, c in keep) * 2
    for _ in range(2):
        buf = ctypes.create_string_buffer(size)
        n = lib.llama_chat_apply_template(tmpl, arr, len(keep), bool(add_assistant), buf, size)
        if n < 0:
            return None
        if n <= size:
            return buf.raw[:n].decode("utf-8", "replace")
        size = n + 1     # the buffer was too small: n is the length needed
    return None


def builtin_names():
    """The names of llama.cpp's built-in chat formats (``--chat-template NAME``)."""
    lib = library.load()
    size = 128
    while True:
        arr = (ctypes.c_char_p * size)()
        n = lib.llama_chat_builtin_templates(arr, size)
        if n <= size:
            return [arr[i].decode() for i in range(n)]
        size = n
