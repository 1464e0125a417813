"""Give the memory of large messages back to the system once they are gone.

glibc's ``malloc`` serves blocks of 128 KiB and more with ``mmap`` and unmaps them when freed,
but it raises that threshold to the size of each such block freed: after the first large
message, the next ones come from the heap, whose free space is kept rather than returned. A
bus that held 170 MB of 900 KiB messages for a while then kept about 400 MiB of RSS for good
(bench/README.md, "Hostile peers"). :func:`return_large_blocks` pins the threshold, as
``MALLOC_MMAP_THRESHOLD_=524288`` in the environment would: large blocks are always mapped, so
their memory goes back when they are freed. Small objects are not concerned (Python's own
allocator serves them), nor asyncio's read buffers (below the threshold).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "return_large_blocks"]

logger = logging.getLogger("bus.ops.memory")

MMAP_THRESHOLD = 512 << 10
"""Blocks of this many bytes or more are mapped on their own. Above asyncio's 256 KiB read
buffer, which every read of every socket allocates: mapping it would cost two system calls a
read (about 12% more CPU per small message in ``bench.ab``, in a wide spread)."""

TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
"""Free bytes at the top of the heap past which glibc gives them back (twice the mmap
threshold, as glibc's own adjustment sets it)."""

_M_TRIM_THRESHOLD = -1  # from <malloc.h>
_M_MMAP_THRESHOLD = -3


def return_large_blocks() -> bool:
    """Pin glibc's mmap threshold at :data:`MMAP_THRESHOLD` unless the environment sets it
    already; return whether it is pinned. Does nothing elsewhere (musl, macOS, Windows)."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return True  # the operator's value wins; glibc read it at start
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not done:
        logger.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return done
