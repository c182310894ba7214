"""The Dask cluster a run computes on, how its work progresses, and what it uses of memory.

One module per job:

- :mod:`rasterflow.cluster.settings`: the spec's ``cluster`` section (:class:`ClusterSettings`) and the worker
  layout a run gets: :func:`local_run_layout` / :func:`process_fallback` on this machine (sizing lives in
  :mod:`rasterflow.sizing`), :func:`remote_layout` of an existing scheduler (:func:`resolve_address`).
- :mod:`rasterflow.cluster.workerenv`: what rasterflow's worker processes start with (``GDAL_CACHEMAX``, Dask
  config, pre-spawn environment, preloads) and the guards around spawning them.
- :mod:`rasterflow.cluster.lifecycle`: :func:`open_cluster` starts a sized ``LocalCluster``, one in-process worker,
  or connects to an existing scheduler and leaves it running; it yields a :class:`ClusterHandle` and shuts down
  what it started.
- :mod:`rasterflow.cluster.progress`: :class:`ProgressReporter` / :func:`progress` / :class:`CountingProgress`, a
  rich bar on a terminal, plain lines for cron.
- :mod:`rasterflow.cluster.telemetry`: :class:`MemorySampler`, per-worker RSS, managed and spilled bytes over time,
  and stage marks, for the run report; :func:`process_peak_since_sample`.

This package re-exports their public names, so ``from rasterflow.cluster import open_cluster`` keeps working. It is
the execution layer: it may import dask and distributed (lazily, inside the functions that need them), and it must
not import ``rasterflow.graph``, ``rasterflow.write`` or ``rasterflow.commands``.
"""

from __future__ import annotations

from rasterflow.cluster.lifecycle import ClusterHandle, open_cluster
from rasterflow.cluster.progress import CountingProgress, ProgressReporter, progress
from rasterflow.cluster.settings import (
    ADDRESS_ENV,
    ONE_PROCESS_MAX_SECONDS,
    ClusterSettings,
    local_run_layout,
    process_fallback,
    remote_layout,
    resolve_address,
)
from rasterflow.cluster.telemetry import CLIENT, IN_PROCESS, MemorySampler, process_peak_since_sample
from rasterflow.cluster.workerenv import gdal_cachemax_env_value, worker_dask_config, worker_environ

__all__ = [
    "ClusterSettings",
    "ClusterHandle",
    "resolve_address",
    "remote_layout",
    "local_run_layout",
    "process_fallback",
    "ONE_PROCESS_MAX_SECONDS",
    "open_cluster",
    "gdal_cachemax_env_value",
    "worker_dask_config",
    "worker_environ",
    "ProgressReporter",
    "progress",
    "MemorySampler",
    "CountingProgress",
    "CLIENT",
    "IN_PROCESS",
    "ADDRESS_ENV",
    "process_peak_since_sample",
]
