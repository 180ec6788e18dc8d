"""Process memory for large work: freed large arrays go back to the system at once.

glibc's ``malloc`` maps a block of at least ``M_MMAP_THRESHOLD`` bytes on its own and
unmaps it when it is freed; smaller blocks come from the heap, whose freed holes stay
resident. The threshold starts at 128 KiB and, by default, grows to the size of each
mapped block freed, up to 32 MiB: after the first large temporary is freed, every array
under 32 MiB comes from the heap. Building a program of 10 M instructions allocates and
frees hundreds of 10-40 MiB arrays, interleaved with the ones it keeps, and the holes
they left were about 230 MB of the peak RSS of ``schedsim simulate -s 1f1b -p 128 -m
10000`` (1.44-1.50 GB, against 1.24 GB with the threshold fixed at :data:`LARGE_BLOCK`,
for about 0.8 s more system time: every freed block is mapped again;
``benchmarks/NOTES.md``, "The 10 M path"). :func:`large_blocks_unpooled` fixes it
(``mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK)``, which also turns the growth off), once per
process, when large work starts; small programs never call it. Off glibc it does
nothing. No schedsim imports.
"""
from __future__ import annotations

import sys

#: blocks of at least this many bytes are mapped on their own (``M_MMAP_THRESHOLD``)
LARGE_BLOCK = 4 << 20
#: arrays of this many entries or more make the work large (an int64 array of 2 MiB)
LARGE_WORK = 1 << 18
_M_MMAP_THRESHOLD = -3      # glibc's malloc.h
_state: bool | None = None  # None: not tried yet


def large_blocks_unpooled(entries: int) -> bool:
    """Before building arrays of ``entries`` entries: when that is :data:`LARGE_WORK` or
    more, have glibc's malloc map every block of :data:`LARGE_BLOCK` bytes or more on its
    own for the rest of the process (module docstring). Returns True if the setting is in
    force (now or from an earlier call); False for small work, off Linux, or when the C
    library has no ``mallopt``."""
    global _state
    if _state is not None or entries < LARGE_WORK:
        return bool(_state)
    _state = False
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            _state = bool(ctypes.CDLL("libc.so.6").mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK))
        except (OSError, AttributeError):       # not glibc
            pass
    return _state
