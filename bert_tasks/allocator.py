"""Keep freed memory in the process instead of handing it back to the OS after every step.

glibc serves allocations above its mmap threshold (at most 32 MiB) with fresh `mmap` pages and unmaps
them on free, so every training step or prediction batch that allocates the same large tensors again
(the 47 MB dense gradient of the word embeddings, activations of a long batch) pays a page fault per
4 KiB page: a fresh zero-filled gradient of that size takes 11x longer than one in reused memory
(14.4 against 1.3 ms, `bench/levers.py`), several % of a short-sentence step. Turning mmap off and
trimming only above 1 GiB is what a caching allocator (jemalloc, tcmalloc: the usual advice for PyTorch
on CPU) does, without preloading one.
The cost: the process's resident memory stays at its peak, which is what a training or serving process
reaches again at its next step anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_MAX = -4
_TRIM_ABOVE = 1 << 30


@cache
def reuse_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse; True when it did (Linux with glibc), else a no-op."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other C libraries have no mallopt
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_ABOVE))
