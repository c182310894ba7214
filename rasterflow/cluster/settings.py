"""What a run computes on: the spec's ``cluster`` section as plain values, and the worker layout it gets.

:class:`ClusterSettings` holds the ``cluster`` section; :func:`resolve_address` says whether the run uses an existing
scheduler (``cluster.address`` / ``DASK_SCHEDULER_ADDRESS``) or a cluster of its own; :func:`local_run_layout` /
:func:`process_fallback` choose the local layout (the sizing itself lives in :mod:`rasterflow.sizing`) and
:func:`remote_layout` reads an existing cluster's real layout, for the budget check. Opening the cluster is
:mod:`rasterflow.cluster.lifecycle`'s job.
"""

from __future__ import annotations

import dataclasses

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rasterflow.errors import ClusterError
from rasterflow.sizing import MachineInfo, WorkerLayout

if TYPE_CHECKING:  # pragma: no cover
    from distributed import Client

    from rasterflow.planning import ClusterPlan
    from rasterflow.spec.models import Cluster

__all__ = [
    "ADDRESS_ENV",
    "ClusterSettings",
    "resolve_address",
    "local_run_layout",
    "process_fallback",
    "remote_layout",
    "connect",
]

ADDRESS_ENV = "DASK_SCHEDULER_ADDRESS"
"""Environment variable naming an existing scheduler; used when the spec's ``cluster.address`` is null."""


@dataclass(frozen=True)
class ClusterSettings:
    """What the spec's ``cluster`` section says, as plain values."""

    address: str | None
    """``tcp://host:8786`` to use an existing cluster; None -> LocalCluster unless DASK_SCHEDULER_ADDRESS is set."""
    n_workers: int | str
    """``"auto"`` or a number of LocalCluster worker processes."""
    threads_per_worker: int
    memory_limit: int | str
    """``"auto"`` or a per-worker size (``"4GB"`` or bytes)."""
    gdal_cachemax: int
    """GDAL block cache per worker process, in bytes."""
    memory_target: float = 0.6
    memory_spill: float = 0.7
    memory_pause: float = 0.8
    memory_terminate: float = 0.95
    connect_timeout: float = 10.0
    """Seconds to wait for an existing scheduler to answer."""
    processes: bool | str = True
    """``cluster.processes``: True (worker processes), False (one process) or ``"auto"``; see
    :func:`local_run_layout`."""
    work_stealing: bool = True
    """Whether the scheduler of a LocalCluster of worker processes moves queued tasks between workers
    (``distributed.scheduler.work-stealing``). Off where the writer places each chunk on the worker whose process
    started its reads (:attr:`rasterflow.planning.JobPlan.places_reads`): a stolen task would read them again."""

    @classmethod
    def from_spec(cls, cluster: Cluster | ClusterPlan, gdal_cachemax: int | None = None) -> ClusterSettings:
        """Build from the validated spec's ``cluster`` section (or the plan's, with the same attribute names);
        ``gdal_cachemax``: the plan's (``auto`` resolved, :attr:`rasterflow.planning.JobPlan.gdal_cachemax`), else the
        spec's size, or for ``auto`` without a plan the default."""
        from rasterflow.budget import spec_gdal_cachemax

        settings = cls(
            address=cluster.address,
            n_workers=cluster.n_workers,
            threads_per_worker=int(cluster.threads_per_worker),
            memory_limit=cluster.memory_limit,
            gdal_cachemax=spec_gdal_cachemax(cluster.gdal_cachemax) if gdal_cachemax is None else int(gdal_cachemax),
            processes=getattr(cluster, "processes", True),
        )
        memory = getattr(cluster, "memory", None)
        if memory is None:
            return settings
        return dataclasses.replace(settings, memory_target=float(memory.target), memory_spill=float(memory.spill),
                                   memory_pause=float(memory.pause), memory_terminate=float(memory.terminate))



def resolve_address(settings: ClusterSettings) -> str | None:
    """The scheduler to connect to: ``settings.address``, else env ``DASK_SCHEDULER_ADDRESS``, else None (local)."""
    if settings.address:
        return settings.address
    return os.environ.get(ADDRESS_ENV) or None


def local_run_layout(settings: ClusterSettings, machine: MachineInfo | None = None) -> WorkerLayout:
    """The layout of a run on this machine: worker processes or one process, as ``settings.processes`` says
    (:func:`rasterflow.sizing.size_local_run`; ``machine`` default: this one)."""
    from rasterflow.sizing import local_machine, size_local_run

    return size_local_run(machine or local_machine(), n_workers=settings.n_workers,
                          threads_per_worker=settings.threads_per_worker, memory_limit=settings.memory_limit,
                          processes=settings.processes)


ONE_PROCESS_MAX_SECONDS = 20.0
"""``processes: auto`` runs a job in one process when the plan estimates less compute than this (seconds, start-up
excluded), else in worker processes. One process saves the workers' start-up and memory, but its threads share one
interpreter: measured on 2 cores (benchmarks/README.md, remote_read.py and compare_peers.py), a 4096² x 8-date job
(estimated 3 s) ran in 3.5 s in one process against 5.0 s in two worker processes, a 5490² x 36-date one
(estimated 28 s) in 13.6 s against 11.5 s, the 10980² x 36-date tile (estimated 2 min) in 44 s against 36 s, and
over a 40 ms network 88 s against 72 s."""


def process_fallback(settings: ClusterSettings, layout: WorkerLayout,
                     machine: MachineInfo | None = None) -> WorkerLayout | None:
    """``processes: auto`` chose one process (``layout``): the worker processes' layout to plan again with when the
    job's budget refuses one process or the job is long (:data:`ONE_PROCESS_MAX_SECONDS`); None when there is
    nothing to fall back to (the layout was asked for, or is not a one-process one)."""
    if settings.processes != "auto" or layout.processes or resolve_address(settings):
        return None
    from rasterflow.sizing import local_machine, size_local_cluster

    return size_local_cluster(machine or local_machine(), n_workers=settings.n_workers,
                              threads_per_worker=settings.threads_per_worker, memory_limit=settings.memory_limit)


def _unreachable(address: str, timeout: float, exc: BaseException) -> ClusterError:
    return ClusterError(
        f"cannot reach the Dask scheduler at {address} within {timeout:g} s ({type(exc).__name__}: {exc}). "
        f"Check that the scheduler is running and listening on that host and port, that cluster.address "
        f"(or ${ADDRESS_ENV}) names it correctly, and that this machine can reach it (firewall, VPN, TLS)."
    )


def connect(address: str, timeout: float, *, set_as_default: bool) -> Client:
    """A ``distributed.Client`` of the scheduler at ``address``.

    Raises
    ------
    ClusterError
        The scheduler did not answer within ``timeout`` seconds, or ``address`` is malformed.
    """
    from distributed import Client

    try:
        return Client(address, timeout=timeout, set_as_default=set_as_default)
    except (OSError, ValueError, TypeError) as exc:  # TimeoutError is an OSError; a malformed address a ValueError
        raise _unreachable(address, timeout, exc) from exc


def _layout_from_info(info: dict[str, Any], address: str) -> WorkerLayout:
    workers = info.get("workers") or {}
    if not workers:
        raise ClusterError(
            f"the Dask scheduler at {address} has no workers; start some (`dask worker {address} "
            f"--memory-limit 4GB --nthreads 1`) or wait until they have joined"
        )
    limits = [int(w.get("memory_limit") or 0) for w in workers.values()]
    limited = [m for m in limits if m > 0]
    if not limited:
        raise ClusterError(
            f"the workers of {address} have no memory limit, so no memory budget can be checked; "
            f"restart them with e.g. `dask worker {address} --memory-limit 4GB`"
        )
    threads = max(int(w.get("nthreads") or 1) for w in workers.values())
    return WorkerLayout(n_workers=len(workers), threads_per_worker=threads, memory_limit=min(limited), source=address)


def remote_layout(address: str, timeout: float = 10) -> WorkerLayout:
    """The layout of an existing cluster, read from its scheduler: the workers' real limits and thread counts.

    ``memory_limit`` is the smallest worker limit and ``threads_per_worker`` the largest thread count, so the budget
    check is made against the tightest worker.

    Raises
    ------
    ClusterError
        The scheduler is unreachable within ``timeout`` seconds, has no workers, or its workers have no memory limit.
    """
    client = connect(address, timeout, set_as_default=False)
    try:
        info = client.scheduler_info(n_workers=-1)
    finally:
        client.close()
    return _layout_from_info(info, address)
