"""The C boundary: the only package that imports ctypes and calls llama.cpp."""
