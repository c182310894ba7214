"""glibc's allocator in the processes that run rasterflow's tasks.

A task allocates and frees plane-sized arrays (0.25-8 MB) for every date it evaluates. distributed's nannies start
workers with ``MALLOC_TRIM_THRESHOLD_=65536``, and *any* fixed allocator setting (trim or mmap threshold, top pad)
also switches off glibc's dynamic thresholds: the mmap threshold, which otherwise rises to the size of the largest
freed mapping (up to 32 MiB), and with it the trim threshold (twice that). With a trim threshold below one date's
temporaries (distributed's 64 KiB, a fixed 2 MiB, or glibc's dynamic one while it is still low) the heap shrinks
after every date and the next date's temporaries fault their pages in again (measured in one process: 224,000 page
faults and 0.5 s of system time per 1024² x 36-date task, 12,000 once the threshold is above a date's temporaries;
in one thread a task took 1.92 s with distributed's setting, 0.82 s with glibc's defaults). rasterflow's worker processes therefore start with glibc's
own defaults (distributed's trim threshold removed, see :func:`rasterflow.cluster.worker_environ`; the user's own
``MALLOC_*`` settings in the Dask config win), and every task trims the heap after each sub-block
(:func:`release_free_memory`), so a worker's memory between sub-blocks is what it holds, not what its last one freed.

Measured 2026-12-04 on the 4096² x 36 season sample, ``rasterflow run`` with 2 workers x 1 thread, 3 interleaved
rounds (benchmarks/README.md, "Worker malloc"): compute+write 9.8-10.1 s and peak per worker 410-415 MB with glibc's
defaults, against 10.0-11.0 s and 421-423 MB with the fixed 2 MiB mmap/trim/top-pad thresholds rasterflow's workers
had from 61592a5 on; fixed 16 MiB mmap / 64 MiB trim thresholds were faster still (9.2-9.5 s) but held 464-470 MB
(+13%, over the budget's 421 MB), so memory decided.

Arenas: glibc gives each thread that allocates its own arena (up to 8 per core), and an arena keeps its
fragments. A worker process has more threads than its task threads (the event loop, Zarr's codec pool, the
executor's): over its first tasks each gets an arena, and the worker's peak crept ~10% above a short job's. Worker
processes therefore start with ``MALLOC_ARENA_MAX=1`` (:data:`WORKER_ARENA_MAX`), which leaves glibc's dynamic
thresholds on (only the mmap/trim/top-pad settings switch them off). Measured 2026-12-04, masked NDVI median,
2 workers x 1 thread, 8 dates, per-worker peak from the run report (benchmarks/README.md, "Worker arenas"): 4096²
job 214 MB, 5792² job (18 tasks a worker) 225-237 MB (+5..+11%) with glibc's default; 209 MB and 209-213 MB (+0..+2%)
with one arena, 212 and 217-228 MB with two; compute+write unchanged (2.1-2.6 s and 3.0-3.3 s either way), also
with two task threads on the one arena.

Nothing here is needed for correctness; off glibc (macOS, musl) :func:`release_free_memory` does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

__all__ = ["DISTRIBUTED_TRIM_THRESHOLD", "WORKER_ARENA_MAX", "release_free_memory", "can_trim"]

DISTRIBUTED_TRIM_THRESHOLD = 65536
"""distributed's default ``MALLOC_TRIM_THRESHOLD_`` for worker processes (its distributed.yaml,
``distributed.nanny.pre-spawn-environ``): removed for rasterflow's workers; another value is the user's choice."""

WORKER_ARENA_MAX = 1
"""``MALLOC_ARENA_MAX`` of rasterflow's worker processes (see the module docstring); the user's own setting (their
environment or the Dask config's ``distributed.nanny.pre-spawn-environ``) wins."""


@functools.lru_cache(maxsize=1)
def _glibc() -> Any:
    try:
        # the C library the process already has (dlopen(NULL)): ``ctypes.util.find_library`` would run
        # ``ldconfig -p`` in a child process of every worker and of a one-process run
        libc = ctypes.CDLL(None)
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
