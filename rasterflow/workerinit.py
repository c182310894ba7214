"""Run in each LocalCluster worker process at start (a Dask *preload*): leave signals to the run, logs to a file.

A terminal's Ctrl-C (SIGINT), a closed terminal (SIGHUP) and ``timeout``'s SIGTERM go to the whole process group,
workers included. Left to Python's defaults a worker prints a ``KeyboardInterrupt`` traceback or dies under the
nanny, which restarts it. Workers ignore these signals instead: the run's own handler shuts the cluster down (the
nanny stops each worker by message, then by SIGKILL if it must). A worker whose parent dies without that (SIGKILL,
or a host program that ends without closing the cluster) exits by itself: a watchdog thread sees it re-parented.

With ``RASTERFLOW_WORKER_LOG`` set, the worker's stderr, stdout and Python logging go to that file (appended), so
worker tracebacks and GDAL messages land beside the run report instead of on the terminal.

Only a LocalCluster that rasterflow starts runs this preload: the workers of a cluster started outside rasterflow
keep their own signals and logs (their owner's), and get what a run needs through worker plugins registered by the
client instead (:mod:`rasterflow.read.worker`: the read policy, GDAL's per-process settings and block cache size).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

__all__ = ["dask_setup", "WORKER_LOG_ENV"]

WORKER_LOG_ENV = "RASTERFLOW_WORKER_LOG"


def _exit_with_parent(parent: int, interval: float = 1.0) -> None:
    # Ignoring SIGTERM means a group-wide SIGTERM no longer ends this process when its parent could not shut the
    # cluster down; never outlive the parent.
    while True:
        time.sleep(interval)
        if os.getppid() != parent:
            os._exit(1)


def _die_with_parent_in_the_kernel() -> None:
    # The watchdog thread needs the GIL; a worker wedged while holding it (a C library stuck in a call) would
    # outlive the run and keep the run's pipes open. Linux can deliver SIGKILL itself when the parent goes.
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not glibc/musl: the watchdog thread still stands
        pass


def dask_setup(worker: Any = None) -> None:
    """Called by distributed in the worker process (main thread) before the worker starts."""
    _die_with_parent_in_the_kernel()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="rasterflow-parent-watch",
                     daemon=True).start()
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            try:
                signal.signal(sig, signal.SIG_IGN)
            except ValueError:  # not the main thread: nothing we can do
                pass
    path = os.environ.get(WORKER_LOG_ENV)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 2)  # C-level writes (GDAL) too
    os.dup2(fd, 1)
    os.close(fd)
    handler = logging.StreamHandler(open(path, "a", buffering=1))
    handler.setLevel(logging.WARNING)  # what a run needs to know; the INFO chatter of every start stays out
    handler.setFormatter(logging.Formatter(f"%(asctime)s worker {os.getpid()} %(name)s %(levelname)s %(message)s"))
    for logger_name in ("distributed", "dask", "rasterio", "rasterflow"):
        logger = logging.getLogger(logger_name)
        for old in list(logger.handlers):  # the stderr handlers distributed installed
            if isinstance(old, logging.StreamHandler) and getattr(old, "stream", None) in (sys.stderr, sys.__stderr__):
                logger.removeHandler(old)
        logger.addHandler(handler)
