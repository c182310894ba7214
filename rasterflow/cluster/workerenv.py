"""What rasterflow's worker processes start with, and the guards around spawning them.

The ``GDAL_CACHEMAX`` value of a worker's environment (:func:`gdal_cachemax_env_value`), the workers' Dask config
(memory thresholds, spill compression: :func:`worker_dask_config`), the nanny's pre-spawn environment without
distributed's allocator setting (:func:`worker_environ`), the user's configured worker preloads, and what keeps the
spawning from leaking into this process: the nanny's writes to this process's environment put back, the main script
not run again in each worker. Starting and closing the cluster is :mod:`rasterflow.cluster.lifecycle`'s job.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping

if TYPE_CHECKING:
    from rasterflow.cluster.settings import ClusterSettings

__all__ = [
    "gdal_cachemax_env_value",
    "worker_dask_config",
    "worker_environ",
    "drop_leaked_trim_threshold",
    "check_lz4",
    "pre_spawn_keys",
    "restore_environ",
    "configured_preloads",
    "main_not_rerun",
]

log = logging.getLogger(__name__)

_GDAL_MB_THRESHOLD = 100_000
"""GDAL reads a bare GDAL_CACHEMAX number below 100000 as megabytes (MiB) and one at or above it as bytes."""


def gdal_cachemax_env_value(nbytes: int) -> str:
    """``GDAL_CACHEMAX`` as GDAL reads it from the environment, exactly ``nbytes``.

    GDAL takes a bare number below 100000 as megabytes (MiB) and one at or above 100000 as bytes; sizes in a spec
    are bytes, so they are passed as bytes (``256MB`` -> ``"256000000"``, read back by GDAL as 256000000). A size
    below 100 kB cannot be given in bytes and is rounded up to whole MiB.
    """
    nbytes = int(nbytes)
    if nbytes < 0:
        raise ValueError(f"GDAL_CACHEMAX cannot be negative (got {nbytes})")
    if nbytes == 0 or nbytes >= _GDAL_MB_THRESHOLD:
        return str(nbytes)
    return str(math.ceil(nbytes / 2**20))


def worker_dask_config(settings: ClusterSettings) -> dict[str, Any]:
    """The Dask config a LocalCluster's workers (and nannies) are started with."""
    return {
        "distributed.worker.memory.target": settings.memory_target,
        "distributed.worker.memory.spill": settings.memory_spill,
        "distributed.worker.memory.pause": settings.memory_pause,
        "distributed.worker.memory.terminate": settings.memory_terminate,
        # "auto" is lz4 when lz4 is installed; without it, no compression at all (zlib is never chosen by "auto").
        "distributed.worker.memory.spill-compression": "auto",
        # The worker's statistical profiler calls sys._current_frames() every 10 ms; on Python <= 3.11 that can
        # deadlock the worker against the garbage collector (HEAD_LOCK vs the GIL: cpython#106883,
        # dask/distributed#8616, not fixed in 3.11): a run whose worker froze mid-write never ended. distributed
        # already skips its event-loop profiler on 3.11 for the same reason; nothing of rasterflow uses either.
        **({"distributed.worker.profile.enabled": False} if sys.version_info < (3, 12) else {}),
    }


def worker_environ() -> dict[str, int]:
    """``distributed.nanny.pre-spawn-environ`` for rasterflow's worker processes: distributed's own (one thread per
    numerical library) without its ``MALLOC_TRIM_THRESHOLD_=65536``, so that glibc's allocator keeps its dynamic
    thresholds (2.3x faster tasks than with distributed's setting), and with one malloc arena (a worker's memory
    does not creep up with its tasks); see :mod:`rasterflow.allocator`. Allocator settings of the user's Dask config
    win, and a ``MALLOC_ARENA_MAX`` of the environment (which the workers inherit)."""
    import dask

    from rasterflow.allocator import DISTRIBUTED_TRIM_THRESHOLD, WORKER_ARENA_MAX

    configured = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    users_own = any(k.startswith("MALLOC_")
                    and not (k == "MALLOC_TRIM_THRESHOLD_" and v == DISTRIBUTED_TRIM_THRESHOLD)
                    for k, v in configured.items())
    if users_own:
        return configured
    environ = {k: v for k, v in configured.items() if k != "MALLOC_TRIM_THRESHOLD_"}
    if "MALLOC_ARENA_MAX" not in os.environ:
        environ["MALLOC_ARENA_MAX"] = WORKER_ARENA_MAX
    return environ


def drop_leaked_trim_threshold(spawn_environ: Mapping[str, Any]) -> None:
    """Take distributed's ``MALLOC_TRIM_THRESHOLD_=65536`` out of this process's environment while the workers
    spawn (they inherit it, and a nanny can set variables but not unset them), unless the worker environment sets
    one. It gets here when an earlier nanny in this process (any other LocalCluster) wrote it and did not take it
    back; the caller restores the environment (``saved``) once the workers exist."""
    from rasterflow.allocator import DISTRIBUTED_TRIM_THRESHOLD

    key = "MALLOC_TRIM_THRESHOLD_"
    if key not in spawn_environ and os.environ.get(key) == str(DISTRIBUTED_TRIM_THRESHOLD):
        del os.environ[key]


def check_lz4() -> bool:
    """Whether lz4 is installed, which spill compression ``"auto"`` needs; warns when it is not."""
    if importlib.util.find_spec("lz4") is None:
        log.warning(
            "lz4 is not installed: Dask's spill compression 'auto' means no compression, so spilled chunks take "
            "their full size on disk; install lz4 (a rasterflow dependency) to fix"
        )
        return False
    return True


def pre_spawn_keys() -> list[str]:
    """Variables a nanny writes into its own process's environment before spawning a worker."""
    import dask

    keys = [str(k) for k in (dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})]
    keys += [k for k in (*worker_environ(), "MALLOC_TRIM_THRESHOLD_") if k not in keys]  # (see drop_leaked_trim...)
    return keys + ["PYTHONHASHSEED"]  # the nanny adds PYTHONHASHSEED=6640 when it is unset or "0"


def restore_environ(saved: dict[str, str | None]) -> None:
    """Undo what the nanny wrote into this process's environment before spawning workers."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def configured_preloads() -> list[str]:
    """The worker preloads of the user's Dask config (``distributed.worker.preload``: a list, or one string)."""
    import dask

    configured = dask.config.get("distributed.worker.preload", None) or []
    return [configured] if isinstance(configured, str) else [str(p) for p in configured]


@contextmanager
def main_not_rerun() -> Iterator[None]:
    """While rasterflow's worker processes may be spawned, keep multiprocessing from running the main script again in
    each of them.

    A spawned child runs the parent's ``__main__`` again (as ``__mp_main__``) to find the functions it is sent; a
    script calling ``rasterflow.run(...)`` without an ``if __name__ == "__main__":`` guard then starts the run again
    in every worker, which fails ("Nanny failed to start", three tracebacks). rasterflow's workers need nothing from
    ``__main__`` (the tasks are rasterflow's functions), so for the cluster's lifetime ``__main__`` is presented to
    multiprocessing as a notebook's is (``__spec__`` named ``__main__``): the children skip it. Put back on exit."""
    import importlib.machinery

    main = sys.modules.get("__main__")
    if main is None or (getattr(main, "__file__", None) is None and getattr(main, "__spec__", None) is None):
        yield  # an interactive session: nothing is re-run anyway
        return
    missing = object()
    previous = main.__dict__.get("__spec__", missing)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        if previous is missing:
            main.__dict__.pop("__spec__", None)
        else:
            main.__spec__ = previous
