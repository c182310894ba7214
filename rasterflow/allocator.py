"""glibc's allocator settings for the processes that run rasterflow's tasks.

A task allocates and frees plane-sized arrays (0.25-4 MB) for every date it evaluates. distributed's nannies start
workers with ``MALLOC_TRIM_THRESHOLD_=65536``, and a fixed trim threshold also freezes glibc's mmap threshold at
128 KiB: every such array is then a fresh ``mmap`` whose pages fault in (zeroed) on first touch. Even with glibc's
defaults, a process that has imported xarray grows and trims the top of its heap around every temporary (``brk``
up and down: measured, 10x the time of ``(nir - red) / (nir + red)`` on 512² planes). Measured on the 4096² x 36
season sample (benchmarks/README.md, "Worker malloc"), 2 workers x 1 thread, compute+write: distributed's setting
17.2-18.8 s and 0.39 GB per worker; these settings 12.2-13.6 s and 0.44 GB, and with :func:`release_free_memory`
after every sub-block 11.8-13.2 s and 0.42 GB (the budget's prediction: 0.42 GB); larger thresholds (8-32 MiB)
are no faster and hold 0.48-0.54 GB.

A run in one process (``cluster.processes: false``) keeps glibc's defaults (its tasks run in a thread of their own
arena; ``mallopt`` with these values measured no faster there, 13-16 s vs 12.4-14.4 s) and trims after every
sub-block like any worker (0.59 GB instead of 0.65 GB for the whole process).

Nothing here is needed for correctness; off glibc (macOS, musl) :func:`release_free_memory` does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

__all__ = ["WORKER_MALLOC_ENV", "release_free_memory", "can_trim"]

MMAP_THRESHOLD = 2 * 2**20
"""Allocations below this come from the heap (the planes of a 512² sub-block: 0.25-1 MB), larger ones are mapped
and returned whole when freed (a chunk's series, the GDAL cache's big blocks)."""
TRIM_THRESHOLD = 2 * 2**20
"""Free memory at the top of the heap above this goes back to the system."""
TOP_PAD = 2 * 2**20
"""What the heap grows by beyond a request, and keeps when it trims: one plane's room, so that freeing and
allocating the next temporary does not move the top of the heap."""

WORKER_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD,
    "MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD,
    "MALLOC_TOP_PAD_": TOP_PAD,
}
"""The same settings as environment variables, for worker processes (read by glibc when the process starts)."""

@functools.lru_cache(maxsize=1)
def _glibc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018  (absent off glibc)
    except (OSError, AttributeError):
        return None
    return libc


def can_trim() -> bool:
    """Whether this process has glibc's ``malloc_trim`` (Linux with glibc), i.e. whether
    :func:`release_free_memory` does anything."""
    return _glibc() is not None


def release_free_memory() -> None:
    """Give the heap's free pages back to the system (``malloc_trim(0)``: also those below the top of the heap),
    after a task: a worker's memory between tasks is then what it holds, not what its last task freed."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
