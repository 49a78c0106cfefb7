"""The C boundary: the only package that imports ctypes and calls llama.cpp.

OpenMP's wait policy is read once, when the library's OpenMP runtime starts, so it is
set here, before anything in this package can load the library. With the default
active wait, the threads of a multi-threaded decode spin between decodes; when another
process holds a core, they fight it and the main thread for CPU time, and a decode that
takes 15 ms on a quiet machine can take seconds (tools/BENCHMARKS.md, "Busy machines").
Passive waiting costs a thread wake-up per decode on a quiet machine and removes those
stalls. A user's own ``OMP_WAIT_POLICY`` wins.
"""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
